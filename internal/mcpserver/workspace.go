package mcpserver

import (
	"fmt"

	"isopod/internal/sandbox"
	"isopod/internal/workspace"
)

// sandbox_run's workspace: a host directory under the host-I/O root, found
// with the same descriptor walk as stdin_file (hostio.Policy.OpenWorkspace)
// and handed to the core open, so the copy is made of the directory the
// walk checked, whatever its path names by then. The caps are fixed
// (workspace.MCP*); workspace_out is a host write like copy_out.

// openWorkspace puts sandbox_run's workspace arguments into r. release
// closes what it opened.
func (s *Server) openWorkspace(r *sandbox.Request, in RunArgs) (release func(), err error) {
	release = func() {}
	if in.Workspace == "" {
		switch {
		case in.WorkspaceAll:
			return release, &refusal{"workspace_all", "needs workspace, the host directory to copy"}
		case in.WorkspaceOut != "":
			return release, &refusal{"workspace_out", "needs workspace, the host directory whose changes it receives"}
		}
		return release, nil
	}
	h := s.cfg.HostIO
	if in.WorkspaceOut != "" {
		if !h.CopyOut {
			return release, h.Disabled("workspace_out", "run git diff in the VM and print it, or name it in read_files")
		}
		// Checked before anything is created.
		if _, err := h.ResolveCopyOut(in.WorkspaceOut); err != nil {
			return release, fmt.Errorf("workspace_out: %w", err)
		}
	}
	path, dir, err := h.OpenWorkspace(in.Workspace)
	if err != nil {
		return release, err
	}
	ws := &workspace.Request{Host: path, Dir: dir, Options: workspace.Options{
		All: in.WorkspaceAll, MaxBytes: workspace.MCPMaxBytes, MaxFiles: workspace.MCPMaxFiles, MaxPatchBytes: workspace.MCPMaxPatchBytes,
	}}
	release = func() { dir.Close() }
	if in.WorkspaceOut != "" {
		out, outDir, err := h.OpenCopyOut(in.WorkspaceOut)
		if err != nil {
			release()
			return func() {}, fmt.Errorf("workspace_out: %w", err)
		}
		ws.Out, ws.OutDir = out, outDir
		release = func() { dir.Close(); outDir.Close() }
	}
	r.Workspace = ws
	return release, nil
}
