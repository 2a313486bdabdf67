package mcpserver

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/knobs"
	"isopod/internal/workspace"
)

func TestOpenWorkspace(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	p.Workspace = true
	noHome := filepath.Join(h.root, "sub")
	tests := []struct {
		name string
		arg  string
		want string // the directory opened; "" means refused
		msg  []string
	}{
		{"relative", "sub", noHome, nil},
		{"absolute inside", noHome, noHome, nil},
		{"dotdot escape", "../outside", "", []string{h.root, knobs.MCPHostIORoot}},
		{"absolute outside", h.outside, "", []string{"outside the host-I/O root"}},
		{"symlinked dir pointing out", "outdir-link", "", []string{h.root}},
		{"through a symlinked parent pointing out", "outdir-link/.", "", []string{h.root}},
		{"the state dir", ".isopod", "", []string{"state directory"}},
		{"the root holding the state dir", ".", "", []string{"holds the isopod state directory", h.home}},
		{"the root by its path", h.root, "", []string{"holds the isopod state directory"}},
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
	p := HostIO{Root: filepath.Join(h.root, "sub"), Home: h.home, Workspace: true}
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

// sandbox_run's workspace arguments: the fixed caps, and refusals before
// anything is made.
func TestOpenWorkspaceArgs(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	p.Workspace = true
	s := &Server{cfg: Config{HostIO: p}}
	r, err := s.buildRequest(RunArgs{Cmd: "true"})
	if err != nil {
		t.Fatal(err)
	}
	release, err := s.openWorkspace(&r, RunArgs{Cmd: "true", Workspace: "sub", WorkspaceAll: true, WorkspaceOut: "out/ws.patch"})
	if err != nil {
		t.Fatal(err)
	}
	w := r.Workspace
	if w == nil || !w.All || w.MaxBytes != workspace.MCPMaxBytes || w.MaxFiles != workspace.MCPMaxFiles ||
		w.MaxPatchBytes != workspace.MCPMaxPatchBytes || w.Out != filepath.Join(h.root, "out", "ws.patch") || w.OutDir == nil {
		t.Errorf("workspace %+v; want sub, all, the MCP caps and the patch destination opened", w)
	}
	release()

	before := snapshotDir(t, h.root)
	for _, tt := range []struct {
		name string
		in   RunArgs
		msg  string
	}{
		{"workspace_all alone", RunArgs{WorkspaceAll: true}, "workspace_all"},
		{"workspace_out alone", RunArgs{WorkspaceOut: "x.patch"}, "workspace_out"},
		{"workspace_out outside", RunArgs{Workspace: "sub", WorkspaceOut: "../outside/x.patch"}, "outside the host-I/O root"},
		{"workspace_out into a missing tree outside", RunArgs{Workspace: "sub", WorkspaceOut: "outdir-link/new/x.patch"}, "outside"},
	} {
		r := r
		r.Workspace = nil
		if _, err := s.openWorkspace(&r, tt.in); err == nil || !strings.Contains(err.Error(), tt.msg) {
			t.Errorf("%s: %v; want a refusal naming %q", tt.name, err, tt.msg)
		}
	}
	sameSnapshot(t, before, snapshotDir(t, h.root))

	p.CopyOut = false
	s = &Server{cfg: Config{HostIO: p}}
	if _, err := s.openWorkspace(&r, RunArgs{Workspace: "sub", WorkspaceOut: "x.patch"}); err == nil || !strings.Contains(err.Error(), knobs.MCPCopyOut) {
		t.Errorf("workspace_out with copy_out off: %v; want a refusal naming %s", err, knobs.MCPCopyOut)
	}
}
