package mcpserver

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/hostio"
)

// Arguments the guest protocol cannot carry are refused before any VM
// starts, naming the argument and the limit, not failed as internal after
// a boot.
func TestRunArgumentsOverProtocolLimits(t *testing.T) {
	core, drv := newFakeCore(t)
	root := t.TempDir()
	s := connect(t, Config{Core: core, HostIO: hostio.Policy{Root: root, Home: filepath.Join(t.TempDir(), "home"), CopyOut: true}, NoStartupGC: true, GCEvery: -1})
	big := strings.Repeat("x", agentproto.MaxHeader)
	longPath := "/" + strings.Repeat("p", agentproto.MaxPath)
	limit, pathMax := strconv.Itoa(agentproto.MaxRequestStrings), strconv.Itoa(agentproto.MaxPath-1)
	for _, tt := range []struct {
		name string
		args map[string]any
		want []string
	}{
		{"env", map[string]any{"cmd": "true", "env": map[string]string{"BIG": big}}, []string{"refused: env:", limit, "(got BIG)"}},
		{"cmd", map[string]any{"cmd": "echo " + big}, []string{"refused: cmd:", limit}},
		{"cwd", map[string]any{"cmd": "true", "cwd": longPath}, []string{"refused: cwd:", pathMax}},
		{"read_files", map[string]any{"cmd": "true", "read_files": []string{"/ok", longPath}}, []string{"refused: read_files[1]:", pathMax}},
		{"copy_out guest", map[string]any{"cmd": "true", "copy_out": []map[string]string{{"guest": longPath, "host": "out"}}}, []string{"refused: copy_out[0].guest:", pathMax}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.args["base"], tt.args["network"] = "base-min", false
			res := s.call(t, context.Background(), ToolSandboxRun, tt.args, nil)
			text := resultText(res)
			if !res.IsError || strings.Contains(text, "frame too large") || strings.Contains(text, "internal") {
				t.Errorf("got %.400s; want a refusal", text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%.400s\ndoes not say %q", text, w)
				}
			}
		})
	}
	if n := len(drv.Machines()); n != 0 {
		t.Errorf("%d machines started for refused calls", n)
	}
}
