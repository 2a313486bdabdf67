package sandbox_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// A request the guest protocol cannot carry is refused before any VM
// starts, naming the field and the limit; one just within it runs.
func TestRequestOverProtocolLimits(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	big := strings.Repeat("x", agentproto.MaxHeader)
	longPath := "/" + strings.Repeat("p", agentproto.MaxPath)
	limit := strconv.Itoa(agentproto.MaxRequestStrings)
	for _, tt := range []struct {
		name  string
		req   sandbox.Request
		field string
		want  []string
	}{
		{"one env entry", sandbox.Request{Argv: []string{"true"}, Env: []string{"BIG=" + big}}, "env", []string{"BIG", limit + " bytes"}},
		{"env in total", sandbox.Request{Argv: []string{"true"}, Env: manyEnv(40, 2000)}, "env", []string{limit}},
		{"argv", sandbox.Request{Argv: []string{"echo", big}}, "argv", []string{"the command (after --)", limit}},
		{"cmd", sandbox.Request{Argv: []string{"/bin/sh", "-c", big}, Shell: true}, "cmd", []string{limit}},
		{"argv with NUL", sandbox.Request{Argv: []string{"echo", "a\x00b"}}, "argv", []string{"NUL"}},
		{"cwd", sandbox.Request{Argv: []string{"true"}, Cwd: longPath}, "cwd", []string{strconv.Itoa(agentproto.MaxPath - 1)}},
		{"copy-out guest path", sandbox.Request{Argv: []string{"true"}, CopyOut: []sandbox.CopyOut{{Guest: longPath, Host: t.TempDir() + "/x"}}}, "copy_out", []string{strconv.Itoa(agentproto.MaxPath - 1)}},
		{"copy-out guest path with NUL", sandbox.Request{Argv: []string{"true"}, CopyOut: []sandbox.CopyOut{{Guest: "/a\x00b", Host: t.TempDir() + "/x"}}}, "copy_out", []string{"NUL"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.req.NoNetwork = true
			_, err := runErr(t, s, tt.req)
			var ae *errdefs.ArgError
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !errors.As(err, &ae) || ae.Field != tt.field {
				t.Fatalf("Run: %v; want an invalid %s", err, tt.field)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v\ndoes not say %q", err, w)
				}
			}
		})
	}
	if n := len(d.Machines()); n != 0 {
		t.Errorf("%d machines started for refused runs", n)
	}
	// Large but within the limit: the guest gets it whole.
	val := strings.Repeat("v", agentproto.MaxRequestStrings-(4<<10))
	rep := run(t, s, sandbox.Request{Argv: []string{"sh", "-c", `printf %s "$BIG" | wc -c`}, Env: []string{"BIG=" + val}, NoNetwork: true})
	if code(rep) != 0 || strings.TrimSpace(rep.Stdout) != strconv.Itoa(len(val)) {
		t.Errorf("a large env within the limit: exit %d, stdout %q; want %d bytes", code(rep), rep.Stdout, len(val))
	}
}

// manyEnv is n entries of size bytes each.
func manyEnv(n, size int) []string {
	var env []string
	for i := range n {
		env = append(env, "K"+strings.Repeat("0", 4)+string(rune('a'+i%26))+string(rune('a'+i/26))+"="+strings.Repeat("v", size))
	}
	return env
}
