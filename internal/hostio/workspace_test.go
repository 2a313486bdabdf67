package hostio

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/knobs"
)

func TestOpenWorkspace(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	p.Workspace = true
	noHome := filepath.Join(h.Root, "sub")
	tests := []struct {
		name string
		arg  string
		want string // the directory opened; "" means refused
		msg  []string
	}{
		{"relative", "sub", noHome, nil},
		{"absolute inside", noHome, noHome, nil},
		{"dotdot escape", "../outside", "", []string{h.Root, knobs.MCPHostIORoot}},
		{"absolute outside", h.Outside, "", []string{"outside the host-I/O root"}},
		{"symlinked dir pointing out", "outdir-link", "", []string{h.Root}},
		{"through a symlinked parent pointing out", "outdir-link/.", "", []string{h.Root}},
		{"the state dir", ".isopod", "", []string{"state directory"}},
		{"the root holding the state dir", ".", "", []string{"holds the isopod state directory", h.Home}},
		{"the root by its path", h.Root, "", []string{"holds the isopod state directory"}},
		{"a file", "ok.txt", "", []string{"not a directory"}},
		{"missing", "nope", "", []string{"does not exist"}},
		{"empty", "", "", []string{"empty"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, dir, err := p.OpenWorkspace(tt.arg)
			if tt.want == "" {
				if err == nil {
					dir.Close()
					t.Fatalf("OpenWorkspace(%q) = %s; want a refusal", tt.arg, got)
				}
				for _, m := range tt.msg {
					if !strings.Contains(err.Error(), m) {
						t.Errorf("OpenWorkspace(%q): %v; want it to mention %q", tt.arg, err, m)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("OpenWorkspace(%q): %v", tt.arg, err)
			}
			defer dir.Close()
			if got != tt.want {
				t.Errorf("OpenWorkspace(%q) = %s; want %s", tt.arg, got, tt.want)
			}
			a, _ := dir.Stat()
			b, _ := os.Stat(tt.want)
			if !os.SameFile(a, b) {
				t.Errorf("OpenWorkspace(%q) opened another directory than %s", tt.arg, tt.want)
			}
		})
	}
}

// The root itself is a workspace when the state directory is elsewhere;
// the switch turns the argument off.
func TestOpenWorkspaceRootAndSwitch(t *testing.T) {
	h := newHostTree(t)
	p := Policy{Root: filepath.Join(h.Root, "sub"), Home: h.Home, Workspace: true}
	got, dir, err := p.OpenWorkspace(".")
	if err != nil || got != p.Root {
		t.Fatalf("OpenWorkspace(.) = %s, %v; want the root", got, err)
	}
	dir.Close()
	p.Workspace = false
	if _, _, err := p.OpenWorkspace("."); err == nil || !strings.Contains(err.Error(), knobs.MCPWorkspace+"=off") {
		t.Errorf("OpenWorkspace with the switch off: %v; want a refusal naming %s", err, knobs.MCPWorkspace)
	}
}
