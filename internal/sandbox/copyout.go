package sandbox

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// stagedFile writes a host destination without ever leaving it half-written:
// bytes go to a sibling ".NAME.isopod-PID-N.part" and are renamed onto the
// destination only by Commit. A symlink at the destination is refused
// (O_NOFOLLOW), and the mode is masked: never setuid, setgid, sticky, or
// group/other write.
type stagedFile struct {
	dest string
	part string
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

// checkDestination refuses a destination that cannot be written safely
// before any VM starts: an existing symlink, a directory, or a missing parent.
func checkDestination(dest string) error {
	if dest == "" {
		return fmt.Errorf("copy-out: empty host path: %w", errdefs.ErrInvalidArgument)
	}
	st, err := os.Lstat(dest)
	switch {
	case err == nil && st.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("copy-out: host path %s is a symlink; isopod writes only the path you name, never through a link: %w", dest, errdefs.ErrInvalidArgument)
	case err == nil && st.IsDir():
		return fmt.Errorf("copy-out: host path %s is a directory; name the file to write: %w", dest, errdefs.ErrInvalidArgument)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("copy-out: %w", err)
	}
	parent := filepath.Dir(dest)
	if st, err := os.Stat(parent); err != nil || !st.IsDir() {
		return fmt.Errorf("copy-out: directory %s does not exist; create it first: %w", parent, errdefs.ErrInvalidArgument)
	}
	return nil
}

func newStagedFile(dest string) (*stagedFile, error) {
	if err := checkDestination(dest); err != nil {
		return nil, err
	}
	part := filepath.Join(filepath.Dir(dest), stagingName(filepath.Base(dest)))
	f, err := os.OpenFile(part, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("copy-out: staging %s: %w", dest, err)
	}
	return &stagedFile{dest: dest, part: part, f: f}, nil
}

func (s *stagedFile) Write(p []byte) (int, error) { return s.f.Write(p) }

// Commit gives the file its masked mode and renames it onto the destination,
// refusing a symlink that appeared there meanwhile.
func (s *stagedFile) Commit(mode fs.FileMode) error {
	if err := s.f.Chmod(mode.Perm() &^ 0o022); err != nil {
		s.Abort()
		return fmt.Errorf("copy-out: %w", err)
	}
	if err := s.f.Close(); err != nil {
		s.Abort()
		return fmt.Errorf("copy-out: %w", err)
	}
	if st, err := os.Lstat(s.dest); err == nil && (st.Mode()&fs.ModeSymlink != 0 || st.IsDir()) {
		s.Abort()
		return fmt.Errorf("copy-out: host path %s became a symlink or directory; refusing to replace it: %w", s.dest, errdefs.ErrInvalidArgument)
	}
	if err := unix.Renameat(unix.AT_FDCWD, s.part, unix.AT_FDCWD, s.dest); err != nil {
		s.Abort()
		return fmt.Errorf("copy-out: publishing %s: %w", s.dest, err)
	}
	s.done = true
	return nil
}

// Abort removes the staging file; the destination is untouched. Idempotent.
func (s *stagedFile) Abort() {
	if s.done {
		return
	}
	s.done = true
	s.f.Close()
	os.Remove(s.part)
}
