package qemu

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// A restore with RAM of its own (vmm.Config.OwnRAM, a session's) copies
// the snapshot's RAM into a fresh memfd while QEMU starts. PrefillRAM
// starts that copy earlier, before the caller's Restore (while it admits
// the resume and makes the network), and the Restore of that snapshot
// takes the copy under way: the copy then overlaps more than QEMU's
// start. Either way QEMU sees only the memfd, as at a boot.

var _ vmm.RAMPrefiller = (*Driver)(nil)

// ramFill is a memfd being filled from a snapshot's RAM file.
type ramFill struct {
	f     *os.File     // the memfd
	ready func() error // waits for the copy
	// src is the RAM file's size and modification time at the start: a
	// file changed since is not what the fill copied.
	src string
}

// prefills are the fills started ahead of their restore, by RAM file.
type prefills struct {
	mu sync.Mutex
	m  map[string]*ramFill
}

// PrefillRAM starts copying the RAM of the snapshot in dir into memory
// for a restore with vmm.Config.OwnRAM of memMiB. release drops the copy
// when no restore took it; a copy that cannot start is left to the
// restore, which fails as it would have.
func (d *Driver) PrefillRAM(dir string, memMiB int) (release func()) {
	path := filepath.Join(dir, snapMemory)
	d.pre.mu.Lock()
	defer d.pre.mu.Unlock()
	fl := d.pre.m[path]
	if fl == nil {
		var err error
		if fl, err = startFill(path, int64(memMiB)<<20); err != nil {
			return func() {}
		}
		if d.pre.m == nil {
			d.pre.m = map[string]*ramFill{}
		}
		d.pre.m[path] = fl
	}
	return func() {
		d.pre.mu.Lock()
		defer d.pre.mu.Unlock()
		if d.pre.m[path] == fl {
			delete(d.pre.m, path)
			fl.f.Close()
		}
	}
}

// takeFill is the fill started ahead for the RAM file at path, if it is
// of size bytes and the file is as it was, else nil.
func (d *Driver) takeFill(path string, size int64) *ramFill {
	d.pre.mu.Lock()
	fl := d.pre.m[path]
	delete(d.pre.m, path)
	d.pre.mu.Unlock()
	if fl == nil {
		return nil
	}
	if st, err := os.Stat(path); err != nil || st.Size() != size || fileStamp(st) != fl.src {
		fl.f.Close()
		return nil
	}
	return fl
}

func fileStamp(st os.FileInfo) string {
	return fmt.Sprintf("%d:%d", st.Size(), st.ModTime().UnixNano())
}

// ownRAM gives a restored machine RAM of its own (vmm.Config.OwnRAM): a
// fresh memfd, mapped shared as a boot's, filled with the snapshot's RAM
// in the background (as a sealed copy is; ready waits for it before the
// incoming migration), started ahead by PrefillRAM or now.
func (d *Driver) ownRAM(cfg *vmm.Config, l *launch, mf *machineFiles, snapshotRAM string) error {
	size := int64(cfg.MemMiB) << 20
	l.ramFrom = "own copy, filled ahead"
	fl := d.takeFill(snapshotRAM, size)
	if fl == nil {
		var err error
		if fl, err = startFill(snapshotRAM, size); err != nil {
			return err
		}
		l.ramFrom = "own copy"
	}
	mf.ramReady = fl.ready
	mf.mem = fl.f
	l.memPath = fdPath(mf.add(fl.f))
	l.ownRAM, l.romOff = true, false
	return nil
}

// startFill makes a memfd of size bytes and starts copying the RAM file
// at path into it.
func startFill(path string, size int64) (*ramFill, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
	}
	st, err := src.Stat()
	if err == nil && st.Size() != size {
		err = fmt.Errorf("the snapshot's RAM is %d bytes, not %d: %w", st.Size(), size, errdefs.ErrInvalidArgument)
	}
	var f, fill *os.File
	if err == nil {
		var fd int
		if fd, err = unix.MemfdCreate("isopod-guest-ram", unix.MFD_CLOEXEC); err == nil {
			f = os.NewFile(uintptr(fd), "guest-ram")
			err = f.Truncate(size)
		}
	}
	if err == nil {
		// The filler's own open file, whose offset nobody else moves.
		fill, err = os.OpenFile(fdPath(int(f.Fd())), os.O_RDWR|unix.O_CLOEXEC, 0)
	}
	if err != nil && f != nil {
		f.Close()
	}
	if err != nil {
		src.Close()
		return nil, fmt.Errorf("qemu: guest memory: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer src.Close()
		defer fill.Close()
		done <- copyData(fill, src, size)
	}()
	var once sync.Once
	var ferr error
	ready := func() error {
		once.Do(func() { ferr = <-done })
		return ferr
	}
	return &ramFill{f: f, ready: ready, src: fileStamp(st)}, nil
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
