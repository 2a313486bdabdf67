package mcpserver

import (
	"isopod/internal/hostio/hostiotest"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/knobs"
	"isopod/internal/workspace"
)

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
		w.MaxPatchBytes != workspace.MCPMaxPatchBytes || w.Out != filepath.Join(h.Root, "out", "ws.patch") || w.OutDir == nil {
		t.Errorf("workspace %+v; want sub, all, the MCP caps and the patch destination opened", w)
	}
	release()

	before := hostiotest.Snapshot(t, h.Root)
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
	hostiotest.SameSnapshot(t, before, hostiotest.Snapshot(t, h.Root))

	p.CopyOut = false
	s = &Server{cfg: Config{HostIO: p}}
	if _, err := s.openWorkspace(&r, RunArgs{Workspace: "sub", WorkspaceOut: "x.patch"}); err == nil || !strings.Contains(err.Error(), knobs.MCPCopyOut) {
		t.Errorf("workspace_out with copy_out off: %v; want a refusal naming %s", err, knobs.MCPCopyOut)
	}
}
