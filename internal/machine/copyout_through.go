package machine

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hostio"
)

// Dest is where one copy-out's bytes go: a staged file renamed onto
// the destination (stagedFile), or a character device or FIFO written
// straight through (throughFile).
type Dest interface {
	WriteAt(p []byte, off int64) (int, error)
	// Commit ends a copy that arrived whole: size is the file's size and
	// mode its guest permission bits.
	Commit(size int64, mode fs.FileMode) error
	// Abort ends a copy that failed. Idempotent.
	Abort()
}

// throughFile writes a copy straight into the character device or FIFO
// that is the destination (/dev/null, a pipe a program reads): renaming a
// staged file onto it would replace the node with a regular file. The
// bytes go in order, the holes the guest left out as zeros, so a reader
// sees the whole file; what went through cannot be taken back, so a copy
// that fails partway has written its first bytes. The node's mode is never
// changed.
type throughFile struct {
	dest string
	f    *os.File
	pos  int64
	stop func() bool // ends the watch of the copy's context
	done bool
}

// zeroChunk is written for the holes of a copy that goes through.
var zeroChunk = make([]byte, 256<<10)

// openThrough opens dest for writing straight through when it exists and
// is a character device or a FIFO; it returns nil, nil for anything else,
// which is staged. dir, when set, is dest's directory opened by the caller
// and dest's last element the name in it. A block device or a socket is
// refused. A FIFO is opened without waiting for a reader, so one without
// a reader fails at once; its writes are bounded by ctx.
func openThrough(ctx context.Context, dest string, dir *os.File) (*throughFile, error) {
	dirfd, name := unix.AT_FDCWD, dest
	if dir != nil {
		dirfd, name = int(dir.Fd()), filepath.Base(dest)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil, nil // missing, or the staging says why not
	}
	if err := hostio.CheckNode("", dest, st.Mode); err != nil || !isThrough(st.Mode) {
		return nil, err
	}
	fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ENXIO) && st.Mode&unix.S_IFMT == unix.S_IFIFO:
		return nil, fmt.Errorf("host path %s is a FIFO that no program has open for reading; start its reader before the run (isopod does not wait for one): %w",
			dest, errdefs.ErrFailedPrecondition)
	case err != nil:
		return nil, fmt.Errorf("opening %s: %w", dest, err)
	}
	// What was opened is what the write goes to, whatever the name was
	// when it was looked at.
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", dest, err)
	}
	if err := hostio.CheckNode("", dest, st.Mode); err != nil || !isThrough(st.Mode) {
		unix.Close(fd)
		if err == nil {
			err = fmt.Errorf("host path %s was replaced while it was opened; try again: %w", dest, errdefs.ErrUnavailable)
		}
		return nil, err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFCHR {
		// A device is written as any program writes it; a FIFO stays
		// non-blocking, under the runtime's poller, so that a reader that
		// stops reading cannot hold the run past its deadline.
		if err := unix.SetNonblock(fd, false); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("%s: %w", dest, err)
		}
	}
	t := &throughFile{dest: dest, f: os.NewFile(uintptr(fd), dest)}
	if dl, ok := ctx.Deadline(); ok {
		t.f.SetWriteDeadline(dl) // refused by a device the poller cannot watch
	}
	t.stop = context.AfterFunc(ctx, func() { t.f.SetWriteDeadline(time.Unix(1, 0)) })
	return t, nil
}

// isThrough reports whether a node of mode is written straight through.
func isThrough(mode uint32) bool {
	return mode&unix.S_IFMT == unix.S_IFCHR || mode&unix.S_IFMT == unix.S_IFIFO
}

// nodeKind names the type of a node that is not a regular file.
func nodeKind(mode uint32) string {
	switch mode & unix.S_IFMT {
	case unix.S_IFLNK:
		return "a symlink"
	case unix.S_IFDIR:
		return "a directory"
	case unix.S_IFCHR:
		return "a character device"
	case unix.S_IFBLK:
		return "a block device"
	case unix.S_IFIFO:
		return "a FIFO"
	case unix.S_IFSOCK:
		return "a socket"
	}
	return "a special file"
}

// WriteAt writes p at off, which is never before what was written: the
// guest sends its chunks in order. The gap since is written as zeros.
func (t *throughFile) WriteAt(p []byte, off int64) (int, error) {
	if off < t.pos {
		return 0, fmt.Errorf("%s: bytes at %d after bytes up to %d; a device or FIFO is written in order", t.dest, off, t.pos)
	}
	if err := t.zeros(off); err != nil {
		return 0, err
	}
	n, err := t.f.Write(p)
	t.pos += int64(n)
	if err != nil {
		return n, fmt.Errorf("writing %s: %w", t.dest, err)
	}
	return n, nil
}

// zeros writes zeros up to end.
func (t *throughFile) zeros(end int64) error {
	for t.pos < end {
		n, err := t.f.Write(zeroChunk[:min(int64(len(zeroChunk)), end-t.pos)])
		t.pos += int64(n)
		if err != nil {
			return fmt.Errorf("writing %s: %w", t.dest, err)
		}
	}
	return nil
}

// Commit writes the zeros after the last data, up to size, and closes the
// node; its mode is left as it is.
func (t *throughFile) Commit(size int64, _ fs.FileMode) error {
	err := t.zeros(size)
	t.Abort()
	return err
}

// Abort closes the node. Idempotent.
func (t *throughFile) Abort() {
	if t.done {
		return
	}
	t.done = true
	t.stop()
	t.f.Close()
}
