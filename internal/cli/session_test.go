package cli

import (
	"strings"
	"testing"
)

// What a session command can refuse without a session or a VM, it
// refuses as one JSON failure of the right class.
func TestSessionRefusals(t *testing.T) {
	for _, tt := range []struct {
		args  []string
		want  string
		class string
	}{
		{[]string{"session", "cp", "a", "b"}, "exactly one side", "invalid_argument"},
		{[]string{"session", "cp", "s1:/a", "s2:/b"}, "exactly one side", "invalid_argument"},
		{[]string{"session", "exec", "nope", "--", "true"}, "no session", "not_found"},
		{[]string{"session", "exec", "nope"}, "usage", "invalid_argument"},
		{[]string{"session", "stop", "ss-000000000000"}, "no session", "not_found"},
		{[]string{"session", "start", "--commit-as", "x"}, "--commit-as belongs to one command", "invalid_argument"},
		{[]string{"session", "start", "--name", "Bad Name"}, "session name", "invalid_argument"},
		{[]string{"session", "start", "--vcpus", "0"}, "--vcpus 0", "invalid_argument"},
		{[]string{"session", "start", "--idle-timeout-s", "-1"}, "positive seconds", "invalid_argument"},
		{[]string{"session", "expose", "x", "http"}, "want a number", "invalid_argument"},
		// A bad label is refused before the session is looked for.
		{[]string{"session", "commit", "nope", "--as", "base"}, `--as "base"`, "invalid_argument"},
		{[]string{"session", "commit", "nope"}, "--as", "invalid_argument"},
		{[]string{"session", "commit", "nope", "--as", "ok/label"}, "no session", "not_found"},
		{[]string{"session", "start", "--max-lifetime-s", "86401"}, "ISOPOD_SESSION_MAX_LIFETIME_S", "invalid_argument"},
	} {
		code, m, _ := runCLI(t, tt.args...)
		if code != 1 || m == nil || m["ok"] != false {
			t.Errorf("%v: exit %d, report %v; want exit 1 and ok:false", tt.args, code, m)
			continue
		}
		if msg, _ := m["error"].(string); !strings.Contains(msg, tt.want) || m["class"] != tt.class {
			t.Errorf("%v: %v; want %s mentioning %q", tt.args, m, tt.class, tt.want)
		}
	}
}

// The help lists the session commands; an empty state root lists no
// session.
func TestSessionListedAndEmpty(t *testing.T) {
	code, m, _ := runCLI(t, "session", "ls")
	if code != 0 || m["ok"] != true {
		t.Fatalf("session ls: %d %v", code, m)
	}
	if s, ok := m["sessions"].([]any); !ok || len(s) != 0 {
		t.Errorf("sessions: %v; want an empty list", m["sessions"])
	}
	var out strings.Builder
	root := newRoot(&env{stdout: &out})
	root.SetOut(&out)
	root.SetArgs([]string{"--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "\n  session ") {
		t.Errorf("the help does not list the session commands:\n%s", out.String())
	}
}
