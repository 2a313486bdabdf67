package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
)

func runCLI(t *testing.T, args ...string) (int, map[string]any, string) {
	t.Helper()
	t.Setenv("ISOPOD_HOME", t.TempDir())
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
		{[]string{"run", "--timeout-s", "0", "--", "true"}, "--timeout-s 0", "invalid_argument"},
		{[]string{"run", "--vcpus", "0", "--", "true"}, "--vcpus 0", "invalid_argument"},
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
