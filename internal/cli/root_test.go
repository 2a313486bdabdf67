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
		args []string
		want string
	}{
		{[]string{"run", "--timeout-s", "0", "--", "true"}, "--timeout-s 0"},
		{[]string{"run", "--vcpus", "0", "--", "true"}, "--vcpus 0"},
		{[]string{"run"}, "no command"},
		{[]string{"run", "--no-such-flag", "--", "true"}, "unknown flag"},
		{[]string{"run", "--copy-out", "nocolon", "--", "true"}, "GUEST:HOST"},
		{[]string{"stage"}, "needs a subcommand"},
		{[]string{"stage", "info", "nothing-here"}, "nothing-here"},
		{[]string{"no-such-command"}, "unknown command"},
	} {
		code, m, stderr := runCLI(t, tt.args...)
		if code != 1 || m == nil || m["ok"] != false {
			t.Errorf("%v: exit %d, report %v; want exit 1 and ok:false", tt.args, code, m)
			continue
		}
		if msg, _ := m["error"].(string); !strings.Contains(msg, tt.want) {
			t.Errorf("%v: error %q does not mention %q", tt.args, msg, tt.want)
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
