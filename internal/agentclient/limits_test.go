package agentclient

import (
	"errors"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// TestLimits: what the protocol cannot carry is refused naming the
// caller's field; what it can passes.
func TestLimits(t *testing.T) {
	big := strings.Repeat("x", agentproto.MaxRequestStrings)
	for _, tt := range []struct {
		name  string
		err   error
		field string // "" passes
	}{
		{"small", CheckExec("argv", []string{"true"}, []string{"A=b"}, "/", nil), ""},
		{"NUL in argv", CheckExec("cmd", []string{"a\x00"}, nil, "/", nil), "cmd"},
		{"big argv", CheckExec("argv", []string{big}, nil, "/", nil), "argv"},
		{"big env", CheckExec("argv", []string{"true"}, []string{"BIG=" + big}, "/", nil), "env"},
		{"base env counts", CheckExec("argv", []string{big[:agentproto.MaxRequestStrings/2]}, nil, "/", []string{big[:agentproto.MaxRequestStrings/2]}), "argv"},
		{"path", CheckGuestPath("cwd", "/tmp"), ""},
		{"long path", CheckGuestPath("cwd", "/"+strings.Repeat("p", agentproto.MaxPath)), "cwd"},
		{"NUL in path", CheckGuestPath("copy_out", "/a\x00b"), "copy_out"},
	} {
		var ae *errdefs.ArgError
		switch {
		case tt.field == "" && tt.err != nil:
			t.Errorf("%s: %v; want it to pass", tt.name, tt.err)
		case tt.field != "" && (!errors.As(tt.err, &ae) || ae.Field != tt.field || !errors.Is(tt.err, errdefs.ErrInvalidArgument)):
			t.Errorf("%s: %v; want an invalid %s", tt.name, tt.err, tt.field)
		}
	}
	if err := CheckExec("argv", []string{"true"}, []string{"SMALL=1", "BIG=" + big}, "/", nil); !strings.Contains(err.Error(), "--env BIG:") {
		t.Errorf("%v; want it to name the largest env entry, BIG", err)
	}
}
