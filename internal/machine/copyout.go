package machine

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/hostio"
)

// stagedFile writes a host destination without ever leaving it half-written:
// bytes go to a sibling ".NAME.isopod-PID-N.part" and are renamed onto the
// destination only by Commit. Every step works relative to a descriptor of
// the destination's directory, so the directory cannot be swapped under it.
// A symlink at the destination is refused (O_NOFOLLOW), the mode is masked
// (never setuid, setgid, sticky, or group/other write), and holes the guest
// left out stay holes.
type stagedFile struct {
	dest string   // for messages
	dir  *os.File // the destination's directory
	name string   // the destination's name in dir
	part string   // the staging file's name in dir
	f    *os.File
	done bool
}

var partSeq atomic.Uint64

// maxNameBytes is NAME_MAX; the staging name is clamped to fit.
const maxNameBytes = 255

func stagingName(base string) string {
	suffix := fmt.Sprintf(".isopod-%d-%d.part", os.Getpid(), partSeq.Add(1))
	room := maxNameBytes - len(suffix) - 1
	if len(base) > room {
		// Cut on a UTF-8 boundary.
		cut := room
		for cut > 0 && base[cut]&0xC0 == 0x80 {
			cut--
		}
		base = base[:cut]
	}
	return "." + base + suffix
}

// IsStagingName reports whether name is a staging file's name made by the
// process pid.
func IsStagingName(name string, pid int) bool {
	return strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".part") &&
		strings.Contains(name, fmt.Sprintf(".isopod-%d-", pid))
}

// newStagedFile stages a write of dest. dir, when set, is the destination's
// directory opened by the caller (the MCP server opens it beneath its
// host-I/O root) and dest's last element is the name in it; otherwise the
// directory is opened by its path, following symlinks there as an operator
// would expect.
func newStagedFile(dest string, dir *os.File) (*stagedFile, error) {
	return newStagedFileAs(dest, dir, stagingName(filepath.Base(dest)))
}

// newStagedFileAs is newStagedFile with the staging file's name given.
func newStagedFileAs(dest string, dir *os.File, part string) (*stagedFile, error) {
	s := &stagedFile{dest: dest, name: filepath.Base(dest)}
	if dir == nil {
		d, err := hostio.Operator{}.OpenCopyOut("copy-out", dest)
		if err != nil {
			return nil, err
		}
		s.dir = d
	} else {
		d, err := DupFile(dir)
		if err != nil {
			return nil, err
		}
		s.dir = d
	}
	s.part = part
	fd, err := unix.Openat(int(s.dir.Fd()), s.part, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		s.dir.Close()
		return nil, fmt.Errorf("staging %s: %w", dest, err)
	}
	s.f = os.NewFile(uintptr(fd), s.part)
	return s, nil
}

func (s *stagedFile) WriteAt(p []byte, off int64) (int, error) { return s.f.WriteAt(p, off) }

// Commit sets the file's size (the guest's holes past the last data stay
// holes), gives it its masked mode and renames it onto the destination,
// refusing anything but a regular file that appeared there meanwhile (a
// symlink, a directory, a device or FIFO, which a rename would replace).
func (s *stagedFile) Commit(size int64, mode fs.FileMode) error {
	err := s.f.Truncate(size)
	if err == nil {
		err = s.f.Chmod(mode.Perm() &^ 0o022)
	}
	if err == nil {
		err = s.f.Close()
	}
	if err != nil {
		s.Abort()
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(s.dir.Fd()), s.name, &st, unix.AT_SYMLINK_NOFOLLOW); err == nil && st.Mode&unix.S_IFMT != unix.S_IFREG {
		s.Abort()
		return fmt.Errorf("host path %s became %s; refusing to replace it: %w", s.dest, nodeKind(st.Mode), errdefs.ErrInvalidArgument)
	}
	if err := unix.Renameat(int(s.dir.Fd()), s.part, int(s.dir.Fd()), s.name); err != nil {
		s.Abort()
		return fmt.Errorf("publishing %s: %w", s.dest, err)
	}
	s.done = true
	s.dir.Close()
	return nil
}

// Abort removes the staging file; the destination is untouched. Idempotent.
func (s *stagedFile) Abort() {
	if s.done {
		return
	}
	s.done = true
	s.f.Close()
	unix.Unlinkat(int(s.dir.Fd()), s.part, 0)
	s.dir.Close()
}

// DupFile returns an independent descriptor of f.
func DupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}

// CopyOutError is a copy-out of a run that failed after its command ran: the guest
// file could not be read (of the class the guest gave: not_found for a
// missing file), or the host destination could not be written.
type CopyOutError struct {
	Guest, Host string
	Err         error
}

func (e *CopyOutError) Error() string {
	return fmt.Sprintf("--copy-out %s:%s: %v", e.Guest, e.Host, e.Err)
}

func (e *CopyOutError) Unwrap() error { return e.Err }

// GetFile names one guest file to copy to a host path.
type GetFile struct {
	Guest, Host string
	// HostDir, when set, is Host's directory, opened by the caller; the
	// file is written in it under Host's last element.
	HostDir *os.File
	// Staging, when set, is told the staging file's path before the file
	// is made, and "" once the copy has ended either way, so that a
	// record that outlives this process can name it.
	Staging func(path string)
}

// GetFile copies g's guest file to its host path, within lim, staged so
// that a failure leaves the destination as it was (a device or FIFO at
// the path is written through instead, within ctx); holes stay holes.
func (v *Machine) GetFile(ctx context.Context, g GetFile, lim agentclient.CopyLimits) (*agentproto.FileDone, error) {
	c, err := v.agent()
	if err != nil {
		return nil, err
	}
	unstage := func() {
		if g.Staging != nil {
			g.Staging("")
		}
	}
	dst, err := Stage(ctx, g)
	if err != nil {
		return nil, err
	}
	fd, err := c.CopyOut(ctx, g.Guest, lim, dst)
	if err != nil {
		dst.Abort()
		unstage()
		return nil, err
	}
	err = dst.Commit(fd.Bytes, fs.FileMode(fd.Mode))
	unstage()
	if err != nil {
		return nil, err
	}
	return fd, nil
}

// Stage creates g.Host's staging file, told to g.Staging first (g.Guest is
// not read); a device or FIFO at g.Host is opened instead, to be written
// through, within ctx. The caller commits or aborts it, then tells
// g.Staging "".
func Stage(ctx context.Context, g GetFile) (Dest, error) {
	if t, err := openThrough(ctx, g.Host, g.HostDir); err != nil {
		return nil, err
	} else if t != nil {
		return t, nil
	}
	part := stagingName(filepath.Base(g.Host))
	if g.Staging != nil {
		g.Staging(filepath.Join(filepath.Dir(g.Host), part))
	}
	sf, err := newStagedFileAs(g.Host, g.HostDir, part)
	if err != nil && g.Staging != nil {
		g.Staging("")
	}
	return sf, err
}

// CopyOut streams the guest file at guest into w, within lim: the low
// level of GetFile, for a caller that keeps the bytes itself.
func (v *Machine) CopyOut(ctx context.Context, guest string, lim agentclient.CopyLimits, w io.WriterAt) (*agentproto.FileDone, error) {
	c, err := v.agent()
	if err != nil {
		return nil, err
	}
	return c.CopyOut(ctx, guest, lim, w)
}

// WorkspaceChanges has the guest list what changed in its workspace, at
// most max entries, each given to fn.
func (v *Machine) WorkspaceChanges(ctx context.Context, max int, fn func(agentproto.WorkspaceEntry) error) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	return c.WorkspaceChanges(ctx, max, fn)
}
