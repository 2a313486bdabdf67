package qemu

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// sealedCache keeps, per file a jailed QEMU opens by name (a snapshot's
// RAM, the kernel, the initramfs), a sealed memfd with its contents: write,
// grow and shrink are sealed, so QEMU may open it read-write (as QEMU 7.2
// insists for RAM it maps privately) whatever the file's own mode, while no
// process, a compromised VMM included, can change what later machines
// read. Built once per process and file version.
//
// A copy is filled in the background (start), so that a restore copies the
// snapshot's RAM while its QEMU starts: QEMU maps the memfd at start but
// touches no guest RAM before the incoming migration (it leaves RAM to the
// migration, and the sealed copy is left out of the stream as shared), and
// the restore waits for the copy to be complete and sealed before that
// migration, before the guest or anything it sends has run in the VMM.
type sealedCache struct {
	mu      sync.Mutex // guards following
	entries map[string]*sealedEntry

	// beforeFill, when set (tests), runs before a copy is filled.
	beforeFill func()
}

type sealedEntry struct {
	id   string   // the file's identity when copied
	f    *os.File // the cache's descriptor of the copy
	done chan struct{}
	err  error // why the copy failed; set before done is closed
}

// wait blocks until the copy is complete and sealed, or has failed.
func (e *sealedEntry) wait() error {
	<-e.done
	return e.err
}

// get returns a descriptor of the sealed copy of path (the caller closes
// it), complete and sealed, making the copy when the file is new or
// changed.
func (c *sealedCache) get(path string) (*os.File, error) {
	f, ready, err := c.start(path)
	if err != nil {
		return nil, err
	}
	if err := ready(); err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

// start is get without the wait: the copy, of the file's size, may still
// be being filled; ready waits until it is complete and sealed and says
// whether it is. Nothing may be read from the copy before ready returns
// nil.
func (c *sealedCache) start(path string) (_ *os.File, ready func() error, err error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
	}
	defer func() {
		if err != nil {
			src.Close()
		}
	}()
	st, err := src.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: %w", err)
	}
	id := fileID(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]*sealedEntry{}
	}
	c.evictGone()
	if e, ok := c.entries[path]; ok && e.id == id {
		src.Close()
		f, err := dupFile(e.f)
		return f, e.wait, err
	}
	f, err := newSealable(src.Name(), st.Size())
	if err != nil {
		return nil, nil, err
	}
	// The filler's own open file, whose offset nobody else moves.
	fill, err := os.OpenFile(fdPath(int(f.Fd())), os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("qemu: sealed copy of %s: %w", path, err)
	}
	out, err := dupFile(f)
	if err != nil {
		f.Close()
		fill.Close()
		return nil, nil, err
	}
	if old, ok := c.entries[path]; ok {
		old.f.Close()
	}
	e := &sealedEntry{id: id, f: f, done: make(chan struct{})}
	c.entries[path] = e
	go c.fill(path, e, fill, src, st.Size())
	return out, e.wait, nil
}

// fill copies size bytes of src into dst, e's copy, seals it and ends e's
// wait; a failed copy leaves the cache. It closes src and dst.
func (c *sealedCache) fill(path string, e *sealedEntry, dst, src *os.File, size int64) {
	defer src.Close()
	defer dst.Close()
	if c.beforeFill != nil {
		c.beforeFill()
	}
	err := copyData(dst, src, size)
	if err == nil {
		err = seal(dst)
	}
	if err != nil {
		e.err = fmt.Errorf("qemu: sealed copy of %s: %w", src.Name(), err)
		c.mu.Lock()
		if c.entries[path] == e {
			delete(c.entries, path)
			e.f.Close()
		}
		c.mu.Unlock()
	}
	close(e.done)
}

// evictGone drops copies of files that were removed or replaced (a copy
// still being filled goes on to its end for whoever holds it).
// Preconditions: c.mu held.
func (c *sealedCache) evictGone() {
	for path, e := range c.entries {
		if st, err := os.Stat(path); err != nil || fileID(st) != e.id {
			e.f.Close()
			delete(c.entries, path)
		}
	}
}

func fileID(st os.FileInfo) string {
	sys, _ := st.Sys().(*syscall.Stat_t)
	var ino uint64
	if sys != nil {
		ino = sys.Ino
	}
	return fmt.Sprintf("%d:%d:%d", ino, st.Size(), st.ModTime().UnixNano())
}

// newSealable is a new memfd of size bytes, all a hole, that can be
// sealed, for a copy of the file name.
func newSealable(name string, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("isopod-sealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("qemu: sealed copy of %s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), "sealed:"+name)
	if err := f.Truncate(size); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: sealed copy of %s: %w", name, err)
	}
	return f, nil
}

// seal forbids writing, growing and shrinking f, and further seals.
func seal(f *os.File) error {
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		return fmt.Errorf("sealing: %w", err)
	}
	return nil
}

// copyData copies the data extents of the first size bytes of src to dst
// at the same offsets; dst has size bytes.
func copyData(dst, src *os.File, size int64) error {
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		} else if err != nil {
			return fmt.Errorf("seeking: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seeking: %w", err)
		}
		hole = min(hole, size)
		if err := copyRange(dst, src, data, hole); err != nil {
			return fmt.Errorf("copying: %w", err)
		}
		off = hole
	}
	return nil
}

// copyRange copies bytes [from, to) of src to the same offsets of dst:
// in the kernel (sendfile, one copy from the page cache), or through a
// buffer where the kernel cannot.
func copyRange(dst, src *os.File, from, to int64) error {
	if _, err := dst.Seek(from, io.SeekStart); err != nil {
		return err
	}
	in := from
	for in < to {
		n, err := unix.Sendfile(int(dst.Fd()), int(src.Fd()), &in, int(min(to-in, 1<<30)))
		if err == unix.EINTR || err == unix.EAGAIN {
			continue
		}
		if err != nil || n == 0 {
			if in == from && (err == unix.EINVAL || err == unix.ENOSYS) {
				_, err = io.Copy(io.NewOffsetWriter(dst, from), io.NewSectionReader(src, from, to-from))
				return err
			}
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
	}
	return nil
}

// dupFile returns an independent descriptor of f.
func dupFile(f *os.File) (*os.File, error) {
	fd, err := unix.FcntlInt(f.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	return os.NewFile(uintptr(fd), f.Name()), nil
}
