package hostio

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A workspace is a host directory, found with the same descriptor walk as
// a stdin file and handed to the core open, so the copy is made of the
// directory the walk checked, whatever its path names by then.

// OpenWorkspace resolves a workspace argument beneath the root to a
// directory and opens it. The directory must not hold the state root. The
// caller closes dir.
func (h Policy) OpenWorkspace(arg string) (path string, dir *os.File, err error) {
	if !h.Workspace {
		return "", nil, h.Disabled("workspace", "copy files in with stdin (a tar of at most 4 MiB) or a stage instead")
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
				arg, w.path, agentproto.FileKind(fileMode(w.st.Mode)), errdefs.ErrInvalidArgument)
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
func (h Policy) namesRoot(arg string) bool {
	if !filepath.IsAbs(arg) {
		return arg != "" && len(components(arg)) == 0
	}
	c := filepath.Clean(arg)
	return c == h.Root || (h.alias != "" && c == h.alias)
}
