package mcpserver

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/workspace"
)

// sandbox_run's workspace: a host directory under the host-I/O root, found
// with the same descriptor walk as stdin_file and handed to the core open,
// so the copy is made of the directory the walk checked, whatever its path
// names by then. The caps are fixed (workspace.MCP*); workspace_out is a
// host write like copy_out.

// OpenWorkspace resolves a workspace argument beneath the root to a
// directory and opens it. The directory must not hold the state root. The
// caller closes dir.
func (h HostIO) OpenWorkspace(arg string) (path string, dir *os.File, err error) {
	if !h.Workspace {
		return "", nil, h.disabled("workspace", "copy files in with stdin (a tar of at most 4 MiB) or a stage instead")
	}
	var fd int
	if h.namesRoot(arg) && h.usable("workspace", arg) == nil {
		// The root itself.
		path = h.Root
		fd, err = unix.Open(h.Root, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	} else {
		w, werr := h.walk("workspace", arg, walkRead)
		if werr != nil {
			return "", nil, werr
		}
		defer w.close()
		if w.file == nil {
			return "", nil, fmt.Errorf("workspace %q does not exist (%s): %w", arg, w.path, errdefs.ErrNotFound)
		}
		if w.st.Mode&unix.S_IFMT != unix.S_IFDIR {
			return "", nil, fmt.Errorf("workspace %q resolves to %s, which is not a directory (%s); name the directory to copy: %w",
				arg, w.path, kindOf(fileMode(w.st.Mode)), errdefs.ErrInvalidArgument)
		}
		path = w.path
		fd, err = unix.Openat(int(w.dir.Fd()), w.name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == nil {
			var st unix.Stat_t
			if serr := unix.Fstat(fd, &st); serr != nil || st.Dev != w.st.Dev || st.Ino != w.st.Ino {
				unix.Close(fd)
				return "", nil, fmt.Errorf("workspace %q: %s was replaced while it was opened; try again: %w", arg, path, errdefs.ErrInvalidArgument)
			}
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("workspace %q: opening %s: %v: %w", arg, path, err, errdefs.ErrInvalidArgument)
	}
	if h.Home != "" && within(path, h.Home) {
		unix.Close(fd)
		return "", nil, fmt.Errorf("workspace %q (%s) holds the isopod state directory %s, which the MCP server never reads; name a directory that does not: %w",
			arg, path, h.Home, errdefs.ErrInvalidArgument)
	}
	return path, os.NewFile(uintptr(fd), path), nil
}

// namesRoot reports whether arg names the root itself.
func (h HostIO) namesRoot(arg string) bool {
	if !filepath.IsAbs(arg) {
		return arg != "" && len(components(arg)) == 0
	}
	c := filepath.Clean(arg)
	return c == h.Root || (h.alias != "" && c == h.alias)
}

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
			return release, h.disabled("workspace_out", "run git diff in the VM and print it, or name it in read_files")
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
	ws := &sandbox.Workspace{Host: path, Dir: dir, Options: workspace.Options{
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
