package mcpserver

import (
	"testing"

	"isopod/internal/hostio"
)

// TestSchemaHidesHostPathsTurnedOff: on stdio too, sandbox_run's schema
// offers a host-path argument only when its switch is on and the root is
// usable.
func TestSchemaHidesHostPathsTurnedOff(t *testing.T) {
	tree := newHostTree(t)
	on := hostio.Policy{Root: tree.Root, Home: tree.Home, StdinFile: true, CopyOut: true, Workspace: true}
	tests := []struct {
		name   string
		policy hostio.Policy
		want   map[string]bool
	}{
		{"all on", on, map[string]bool{"stdin_file": true, "copy_out": true, "workspace": true, "workspace_all": true, "workspace_out": true}},
		{"copy_out off", func() hostio.Policy { p := on; p.CopyOut = false; return p }(),
			map[string]bool{"stdin_file": true, "workspace": true, "workspace_all": true}},
		{"no usable root", hostio.Policy{Home: tree.Home, StdinFile: true, CopyOut: true, Workspace: true}, map[string]bool{}},
	}
	for _, tt := range tests {
		s := connect(t, Config{Core: &scriptedCore{}, HostIO: tt.policy, NoStartupGC: true})
		got := runProperties(t, s)
		for name := range hostPathArgs(on) {
			if got[name] != tt.want[name] {
				t.Errorf("%s: %s offered %v; want %v", tt.name, name, got[name], tt.want[name])
			}
		}
		if !got["cmd"] || !got["read_files"] {
			t.Errorf("%s: the other arguments are missing: %v", tt.name, got)
		}
	}
}
