package qemu

import (
	"errors"
	"fmt"
	"os"
	"sync"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// A machine with a RAM file of its own (vmm.Config.RAMFile, a session's)
// maps that file shared and writable, as a boot's memfd is, so that a
// snapshot can take the file in place. A boot makes it anew, sparse; a
// restore takes the snapshot's RAM file itself (a pause's, a fork's), or
// with vmm.Config.RAMCopy a copy of it (a shared snapshot's: the warm
// pool's), a reflink where the file system allows, else a sparse copy
// filled while QEMU starts.

// ramFile gives the machine the RAM file cfg.RAMFile. QEMU gets a
// descriptor the host opened; a jailed QEMU, which reopens it through
// /proc/self/fd, owns the file for that, and reaches it by no path.
func (d *Driver) ramFile(cfg *vmm.Config, l *launch, mf *machineFiles, snapshotRAM string) error {
	size := int64(cfg.MemMiB) << 20
	var f *os.File
	var err error
	switch {
	case snapshotRAM == "" || cfg.RAMCopy:
		l.ramFrom = "own file, new"
		f, err = newRAMFile(cfg.RAMFile, size)
	default:
		l.ramFrom = "own file"
		if err = adoptRAM(cfg.RAMFile, snapshotRAM); err == nil {
			if f, err = os.OpenFile(cfg.RAMFile, os.O_RDWR|unix.O_CLOEXEC, 0); err != nil {
				err = fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
			}
		}
	}
	if err != nil {
		return fmt.Errorf("qemu: guest memory: %w", err)
	}
	st, err := f.Stat()
	if err == nil && st.Size() != size {
		err = fmt.Errorf("the RAM file is %d bytes, not %d: %w", st.Size(), size, errdefs.ErrInvalidArgument)
	}
	if err == nil && snapshotRAM != "" && cfg.RAMCopy {
		var cloned bool
		cloned, mf.ramReady, err = copyRAM(f, snapshotRAM, size)
		l.ramFrom = map[bool]string{true: "own file, reflink", false: "own file, copy"}[cloned]
	}
	if err == nil && d.jail != nil {
		err = d.lendRAMFile(f)
	}
	if err != nil {
		f.Close()
		if snapshotRAM == "" || cfg.RAMCopy {
			os.Remove(cfg.RAMFile)
		}
		return fmt.Errorf("qemu: guest memory: %w", err)
	}
	mf.mem, mf.ramFile = f, true
	l.memPath = fdPath(mf.add(f))
	l.ownRAM, l.romOff = l.restored, false
	return nil
}

// newRAMFile makes the RAM file path anew: sparse, of size bytes, only
// its owner's.
func newRAMFile(path string, size int64) (*os.File, error) {
	os.Remove(path)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	if err := f.Truncate(size); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return f, nil
}

// copyRAM fills the new RAM file f with the snapshot's RAM file at path:
// a reflink (cloned), or a sparse copy in the background that ready
// waits for.
func copyRAM(f *os.File, path string, size int64) (cloned bool, ready func() error, _ error) {
	src, err := os.Open(path)
	if err != nil {
		return false, nil, fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	st, err := src.Stat()
	if err == nil && st.Size() != size {
		err = fmt.Errorf("the snapshot's RAM is %d bytes, not %d: %w", st.Size(), size, errdefs.ErrInvalidArgument)
	}
	if err != nil {
		src.Close()
		return false, nil, err
	}
	if unix.IoctlFileClone(int(f.Fd()), int(src.Fd())) == nil {
		src.Close()
		return true, nil, nil
	}
	// The filler's own open file, whose offset nobody else moves.
	fill, err := os.OpenFile(fdPath(int(f.Fd())), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		src.Close()
		return false, nil, err
	}
	done := make(chan error, 1)
	go func() {
		defer src.Close()
		defer fill.Close()
		_, err := copyNonZero(fill, src, size)
		done <- err
	}()
	var once sync.Once
	var ferr error
	return false, func() error {
		once.Do(func() { ferr = <-done })
		return ferr
	}, nil
}

// lendRAMFile lets the jailed VMM's uid reopen the RAM file f through
// its descriptor: f becomes that uid's, or, where isopod cannot give a
// file away (a normal user's, whose VMM runs as a subordinate uid), f is
// opened to every uid, which reaches it only by descriptor: it lies in a
// VM directory only its owner can search.
func (d *Driver) lendRAMFile(f *os.File) error {
	if err := f.Chown(d.jail.UID(), -1); !errors.Is(err, unix.EPERM) {
		return err
	}
	return f.Chmod(0o666)
}

// adoptRAM makes the snapshot's RAM file snapshotRAM the RAM file path,
// unless path is that file already.
func adoptRAM(path, snapshotRAM string) error {
	src, err := os.Stat(snapshotRAM)
	if err != nil {
		return fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
	}
	if cur, err := os.Stat(path); err == nil && os.SameFile(cur, src) {
		return nil
	}
	os.Remove(path)
	return os.Link(snapshotRAM, path)
}
