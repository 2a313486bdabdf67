package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"isopod/internal/knobs"
	"isopod/internal/version"
)

func runCLI(t *testing.T, args ...string) (int, map[string]any, string) {
	t.Helper()
	t.Setenv("ISOPOD_HOME", t.TempDir())
	return runCLIHome(t, args...)
}

// runCLIHome is runCLI in the state root ISOPOD_HOME already names.
func runCLIHome(t *testing.T, args ...string) (int, map[string]any, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := Main(context.Background(), args, &out, &errb)
	if out.Len() == 0 {
		return code, nil, errb.String()
	}
	if n := strings.Count(strings.TrimSpace(out.String()), "\n"); n != 0 {
		t.Fatalf("%v: stdout is not one JSON object:\n%s", args, out.String())
	}
	var m map[string]any
	if err := json.Unmarshal(out.Bytes(), &m); err != nil {
		t.Fatalf("%v: stdout is not JSON: %v\n%s", args, err, out.String())
	}
	if !strings.HasPrefix(out.String(), `{"ok":`) {
		t.Errorf("%v: ok is not the first field: %s", args, out.String())
	}
	return code, m, errb.String()
}

func TestFailuresAreOneJSONObject(t *testing.T) {
	for _, tt := range []struct {
		args  []string
		want  string
		class string // "" = not checked
	}{
		{[]string{"run", "--timeout-s", "0", "--", "true"}, "--timeout-s 0: must be between 1 and 3600 seconds", "invalid_argument"},
		{[]string{"run", "--vcpus", "0", "--", "true"}, "--vcpus 0: must be 1 or an even number, at most", "invalid_argument"},
		{[]string{"run", "--mem-mib", "0", "--", "true"}, "--mem-mib 0: must be between 128 and", "invalid_argument"},
		{[]string{"run", "--scratch-mib", "0", "--", "true"}, "--scratch-mib 0: must be between 128 and 65536", "invalid_argument"},
		{[]string{"warmpool", "build", "--vcpus", "0"}, "--vcpus 0: must be 1 or an even number, at most", "invalid_argument"},
		{[]string{"run"}, "no command", "invalid_argument"},
		{[]string{"run", "--no-such-flag", "--", "true"}, "unknown flag", "invalid_argument"},
		{[]string{"run", "--copy-out", "nocolon", "--", "true"}, "GUEST:HOST", "invalid_argument"},
		{[]string{"stage"}, "needs a subcommand", "invalid_argument"},
		{[]string{"stage", "info", "nothing-here"}, "nothing-here", "not_found"},
		{[]string{"no-such-command"}, "unknown command", "invalid_argument"},
		{[]string{"stage", "info"}, "usage: isopod stage info REF", "invalid_argument"},
		{[]string{"vm", "gc", "extra"}, "isopod vm gc", "invalid_argument"},
		{[]string{"vm", "gc", "--keep-last", "-1"}, "--keep-last -1", "invalid_argument"},
		{[]string{"bench", "-n", "0"}, "-n 0", "invalid_argument"},
		{[]string{"bench", "--series", "bogus"}, "known: cold, floor", "invalid_argument"},
	} {
		code, m, stderr := runCLI(t, tt.args...)
		if code != 1 || m == nil || m["ok"] != false {
			t.Errorf("%v: exit %d, report %v; want exit 1 and ok:false", tt.args, code, m)
			continue
		}
		if msg, _ := m["error"].(string); !strings.Contains(msg, tt.want) {
			t.Errorf("%v: error %q does not mention %q", tt.args, msg, tt.want)
		}
		if tt.class != "" && m["class"] != tt.class {
			t.Errorf("%v: class %v; want %s", tt.args, m["class"], tt.class)
		}
		if !strings.Contains(stderr, "error") {
			t.Errorf("%v: nothing on stderr", tt.args)
		}
	}
}

func TestHousekeepingOnEmptyState(t *testing.T) {
	for _, args := range [][]string{{"stage", "list"}, {"vm", "ls"}, {"vm", "gc"}, {"image", "ls"}, {"warmpool", "list"}} {
		code, m, stderr := runCLI(t, args...)
		if code != 0 || m["ok"] != true {
			t.Errorf("%v: exit %d, %v, stderr %s", args, code, m, stderr)
		}
	}
}

// TestHelpAndVersionOnStdout: asked for, help and the version are the
// answer, so they go to stdout.
func TestHelpAndVersionOnStdout(t *testing.T) {
	t.Setenv(knobs.Home, t.TempDir())
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"--version"}, "isopod version " + version.String() + "\n"},
		{[]string{"--help"}, "Usage:"},
		{[]string{"run", "--help"}, "--timeout-s"},
		{nil, "Available Commands:"},
	} {
		var out, errb bytes.Buffer
		code := Main(context.Background(), tt.args, &out, &errb)
		if code != 0 || !strings.Contains(out.String(), tt.want) {
			t.Errorf("isopod %v: exit %d, stdout %q; want exit 0 and %q on stdout (stderr %q)", tt.args, code, out.String(), tt.want, errb.String())
		}
	}
}

// TestJailSetting: ISOPOD_JAIL takes 1/on and 0/off; anything else names
// the values.
func TestJailSetting(t *testing.T) {
	for _, tt := range []struct {
		value string
		ok    bool
		want  string
	}{
		{"off", true, ""},
		{"0", true, ""},
		{"1", true, ""},
		{"on", true, ""},
		{"maybe", false, "use 1 or on (confined) or 0 or off (unconfined)"},
	} {
		t.Setenv(knobs.Jail, tt.value)
		code, m, _ := runCLI(t, "stage", "list")
		if tt.ok {
			if code != 0 || m["ok"] != true {
				t.Errorf("%s=%s: exit %d, %v; want success", knobs.Jail, tt.value, code, m)
			}
			continue
		}
		if msg, _ := m["error"].(string); code != 1 || !strings.Contains(msg, tt.want) {
			t.Errorf("%s=%s: exit %d, %v; want exit 1 and an error saying %q", knobs.Jail, tt.value, code, m, tt.want)
		}
	}
}
