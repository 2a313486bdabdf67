package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

func (c *conn) mountRoot(m *agentproto.Msg) {
	if m.Mount == nil {
		c.replyErr(m.ID, fmt.Errorf("mount: no mount in the request: %w", errdefs.ErrInvalidArgument))
		return
	}
	sys, err := c.system()
	if err == nil {
		err = sys.MountRoot(*m.Mount)
	}
	if err != nil {
		c.log.Error("mount failed", "err", err)
		c.replyErr(m.ID, fmt.Errorf("mount: %w", err))
		return
	}
	c.replyOK(m.ID)
}

// workspaceChanges lists what differs in the workspace after a command, as
// its writable layer records it: files, directories and symlinks written,
// whiteouts (deleted paths) and opaque directories (replaced ones), one
// KindWorkspaceEntry frame each, then OK.
func (c *conn) workspaceChanges(m *agentproto.Msg) {
	sys, err := c.system()
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("workspace changes: %w", err))
		return
	}
	upper, lower := sys.WorkspaceLayers()
	if upper == "" {
		c.replyErr(m.ID, fmt.Errorf("workspace changes: the run has no workspace: %w", errdefs.ErrFailedPrecondition))
		return
	}
	err = walkChanges(upper, lower, func(e agentproto.WorkspaceEntry) error {
		return c.send(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindWorkspaceEntry, Entry: &e}, nil)
	})
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("workspace changes: %w", err))
		return
	}
	c.replyOK(m.ID)
}

// walkChanges reports every entry of an overlay's upper directory, judged
// against its lower directory.
func walkChanges(upper, lower string, emit func(agentproto.WorkspaceEntry) error) error {
	return filepath.WalkDir(upper, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(upper, path)
		if err != nil || rel == "." {
			return err
		}
		if strings.HasPrefix(rel, "..") {
			return fmt.Errorf("%s is outside the workspace", path)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		e, ok := changeOf(path, rel, info, lower)
		if !ok {
			return nil
		}
		return emit(e)
	})
}

// changeOf describes one upper entry; ok is false for what is no change (a
// directory of the original tree that only holds changed entries).
func changeOf(path, rel string, info fs.FileInfo, lower string) (agentproto.WorkspaceEntry, bool) {
	e := agentproto.WorkspaceEntry{Path: filepath.ToSlash(rel), Mode: uint32(info.Mode().Perm())}
	orig, err := os.Lstat(filepath.Join(lower, rel))
	e.InOriginal = err == nil
	switch mode := info.Mode(); {
	case mode&fs.ModeCharDevice != 0 && isWhiteout(info):
		e.Kind, e.Mode = "deleted", 0
	case mode.IsDir():
		if opaque(path) {
			e.Kind = "opaque"
		} else if e.InOriginal && orig.IsDir() && orig.Mode().Perm() == mode.Perm() {
			return e, false
		} else {
			e.Kind = "dir"
		}
	case mode&fs.ModeSymlink != 0:
		e.Kind = "symlink"
		e.Target, _ = os.Readlink(path)
	case mode.IsRegular():
		e.Kind, e.Size = "file", info.Size()
	default:
		return e, false // sockets, FIFOs: not part of a patch
	}
	return e, true
}

// isWhiteout reports whether info is an overlayfs whiteout: a character
// device numbered 0:0.
func isWhiteout(info fs.FileInfo) bool {
	st, ok := info.Sys().(*syscall.Stat_t) // os.Lstat's, not x/sys's
	return ok && st.Rdev == 0
}

// opaque reports whether the directory at path is marked opaque (its lower
// contents hidden).
func opaque(path string) bool {
	buf := make([]byte, 4)
	for _, name := range []string{"trusted.overlay.opaque", "user.overlay.opaque"} {
		n, err := unix.Lgetxattr(path, name, buf)
		if err == nil && n == 1 && buf[0] == 'y' {
			return true
		}
		if err != nil && !errors.Is(err, unix.ENODATA) && !errors.Is(err, unix.ENOTSUP) {
			continue
		}
	}
	return false
}
