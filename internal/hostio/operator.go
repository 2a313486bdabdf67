package hostio

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

// Operator is the CLI's policy: the operator may name any host path, the
// state root included, and the path is taken as named: a copy-out
// destination is refused only when it cannot be written as named (a
// symlink, a directory, a block device or a socket, a directory that is
// missing or not writable), and a stdin file must be a regular file. The
// checks run before any VM starts; the directory opened is what the core
// stages and renames the copy in (sandbox.CopyOut.HostDir), as for the
// MCP server's confined policy.
type Operator struct{}

// ErrSymlink is a copy-out destination that is a symlink, which the
// operator's policy never writes through.
var ErrSymlink = errors.New("is a symlink")

// CheckCopyOut checks dest, the host path of the request field what
// (copy_out, workspace_out), without creating anything.
func (Operator) CheckCopyOut(what, dest string) error {
	what = strings.ReplaceAll(what, "_", "-")
	if dest == "" {
		return fmt.Errorf("%s: empty host path: %w", what, errdefs.ErrInvalidArgument)
	}
	st, err := os.Lstat(dest)
	switch {
	case err == nil && st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s: host path %s %w; isopod writes only the path you name, never through a link: %w", what, dest, ErrSymlink, errdefs.ErrInvalidArgument)
	case err == nil && st.IsDir():
		return fmt.Errorf("%s: host path %s is a directory; name the file to write: %w", what, dest, errdefs.ErrInvalidArgument)
	case err == nil:
		if err := CheckNode(what, dest, uint32(st.Sys().(*syscall.Stat_t).Mode)); err != nil {
			return err
		}
	case !errors.Is(err, fs.ErrNotExist):
		// A name too long, a file used as a directory: the path is wrong.
		return fmt.Errorf("%s: host path %s: %w: %w", what, dest, pathReason(err), errdefs.ErrInvalidArgument)
	}
	parent := filepath.Dir(dest)
	if st, err := os.Stat(parent); err != nil || !st.IsDir() {
		return fmt.Errorf("%s: directory %s does not exist; create it first: %w", what, parent, errdefs.ErrInvalidArgument)
	}
	// A device or FIFO is written in place; anything else is staged in
	// its directory.
	target := parent
	if st != nil && (st.Mode()&fs.ModeCharDevice != 0 || st.Mode()&fs.ModeNamedPipe != 0) {
		target = dest
	}
	if err := unix.Access(target, unix.W_OK); err != nil {
		return fmt.Errorf("%s: cannot write %s (%v); name a path you can write: %w", what, target, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// OpenCopyOut checks dest as CheckCopyOut does and opens its directory,
// following symlinks there as an operator would expect. The caller closes
// dir.
func (o Operator) OpenCopyOut(what, dest string) (dir *os.File, err error) {
	if err := o.CheckCopyOut(what, dest); err != nil {
		return nil, err
	}
	d, err := os.OpenFile(filepath.Dir(dest), os.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the directory of %s: %w", dest, err)
	}
	return d, nil
}

// OpenStdinFile opens a --stdin-file: a regular file only, since opening
// a FIFO or a device could block, before any timeout applies ("-", which
// feeds isopod's own stdin, is the front end's). The caller closes f.
func (Operator) OpenStdinFile(path string) (f *os.File, err error) {
	if st, err := os.Stat(path); err == nil && !st.Mode().IsRegular() {
		return nil, fmt.Errorf("--stdin-file %s: %s, not a regular file; pipe it in with --stdin-file - instead: %w",
			path, agentproto.FileKind(st.Mode()), errdefs.ErrInvalidArgument)
	}
	f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("--stdin-file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("--stdin-file %s: not a regular file; pipe it in with --stdin-file - instead: %w", path, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// CheckNode refuses a copy-out destination of mode that isopod can
// neither replace nor write: a block device or a socket. what, when set,
// is the request field, said first.
func CheckNode(what, dest string, mode uint32) error {
	if what != "" {
		what += ": "
	}
	switch mode & unix.S_IFMT {
	case unix.S_IFBLK:
		return fmt.Errorf("%shost path %s is a block device; isopod never writes a disk, and would not replace its node with a file: name a regular file, a character device or a FIFO: %w",
			what, dest, errdefs.ErrInvalidArgument)
	case unix.S_IFSOCK:
		return fmt.Errorf("%shost path %s is a socket, which cannot be opened for writing; name a regular file, a character device or a FIFO: %w",
			what, dest, errdefs.ErrInvalidArgument)
	}
	return nil
}

// pathReason is the bare reason of a path error.
func pathReason(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
