// Package cpio writes cpio archives in the "newc" format the Linux kernel
// unpacks as an initramfs. Output is deterministic: every timestamp is 0,
// every owner is root, inode numbers are assigned in write order, and a
// [Builder] emits entries sorted by path with each directory before its
// contents.
package cpio

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"sort"
	"strings"
)

// Type bits of a newc mode field.
const (
	TypeDir     = 0o040000
	TypeRegular = 0o100000
	TypeSymlink = 0o120000
	TypeChar    = 0o020000
)

const (
	magic   = "070701"
	trailer = "TRAILER!!!"
	hdrLen  = 110
)

// Header describes one entry. Mode holds the type bits and the permission
// bits (including setuid, setgid and sticky).
type Header struct {
	Name      string
	Mode      uint32
	Size      int64
	RdevMajor uint32
	RdevMinor uint32
}

// Writer writes a newc stream. Call WriteHeader, then write exactly Size
// bytes of content, repeat, then Close to append the trailer.
type Writer struct {
	w       io.Writer
	off     int64
	ino     uint32
	remain  int64
	closed  bool
	lastErr error
}

// NewWriter returns a Writer on w. It does not close w.
func NewWriter(w io.Writer) *Writer { return &Writer{w: w} }

func (cw *Writer) write(p []byte) error {
	if cw.lastErr != nil {
		return cw.lastErr
	}
	n, err := cw.w.Write(p)
	cw.off += int64(n)
	if err != nil {
		cw.lastErr = err
	}
	return err
}

func (cw *Writer) padTo4() error {
	if r := cw.off % 4; r != 0 {
		return cw.write(make([]byte, 4-r))
	}
	return nil
}

// WriteHeader starts a new entry. The previous entry's content must be
// complete.
func (cw *Writer) WriteHeader(h *Header) error {
	if cw.closed {
		return errors.New("cpio: write after close")
	}
	if cw.remain != 0 {
		return fmt.Errorf("cpio: previous entry short by %d bytes", cw.remain)
	}
	if err := cw.padTo4(); err != nil {
		return err
	}
	name := strings.TrimPrefix(h.Name, "/")
	if name == "" || strings.ContainsRune(name, 0) {
		return fmt.Errorf("cpio: invalid entry name %q", h.Name)
	}
	if h.Size < 0 || h.Size > 0xffffffff {
		return fmt.Errorf("cpio: %s: size %d out of range", name, h.Size)
	}
	if h.Mode&0o170000 != TypeRegular && h.Mode&0o170000 != TypeSymlink && h.Size != 0 {
		return fmt.Errorf("cpio: %s: only files and symlinks carry content", name)
	}
	cw.ino++
	nlink := uint32(1)
	if h.Mode&0o170000 == TypeDir {
		nlink = 2
	}
	if err := cw.writeRaw(cw.ino, h.Mode, nlink, uint32(h.Size), h.RdevMajor, h.RdevMinor, name); err != nil {
		return err
	}
	cw.remain = h.Size
	return nil
}

func (cw *Writer) writeRaw(ino, mode, nlink, size, rmaj, rmin uint32, name string) error {
	hdr := fmt.Sprintf("%s%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x%08x",
		magic, ino, mode, 0, 0, nlink, 0, size, 0, 0, rmaj, rmin, len(name)+1, 0)
	if len(hdr) != hdrLen {
		return fmt.Errorf("cpio: internal error: header length %d", len(hdr))
	}
	if err := cw.write([]byte(hdr + name + "\x00")); err != nil {
		return err
	}
	return cw.padTo4()
}

// Write writes content of the current entry.
func (cw *Writer) Write(p []byte) (int, error) {
	if int64(len(p)) > cw.remain {
		return 0, fmt.Errorf("cpio: write of %d bytes exceeds entry size (%d left)", len(p), cw.remain)
	}
	if err := cw.write(p); err != nil {
		return 0, err
	}
	cw.remain -= int64(len(p))
	return len(p), nil
}

// Close writes the trailer. It does not close the underlying writer.
func (cw *Writer) Close() error {
	if cw.closed {
		return nil
	}
	if cw.remain != 0 {
		return fmt.Errorf("cpio: last entry short by %d bytes", cw.remain)
	}
	if err := cw.padTo4(); err != nil {
		return err
	}
	if err := cw.writeRaw(0, 0, 1, 0, 0, 0, trailer); err != nil {
		return err
	}
	cw.closed = true
	return nil
}

// entry is one pending Builder entry.
type entry struct {
	mode       uint32
	data       []byte
	rmaj, rmin uint32
}

// Builder collects entries and writes them in a canonical order. Parent
// directories that were not added explicitly are created with mode 0755.
type Builder struct {
	entries map[string]*entry
}

// NewBuilder returns an empty Builder.
func NewBuilder() *Builder { return &Builder{entries: map[string]*entry{}} }

func clean(name string) (string, error) {
	c := path.Clean("/" + name)
	if c == "/" {
		return "", fmt.Errorf("cpio: entry name %q names the root", name)
	}
	return c[1:], nil
}

func (b *Builder) add(name string, e *entry) error {
	n, err := clean(name)
	if err != nil {
		return err
	}
	if old, ok := b.entries[n]; ok {
		if old.mode&0o170000 == TypeDir && e.mode&0o170000 == TypeDir {
			old.mode = e.mode
			return nil
		}
		return fmt.Errorf("cpio: duplicate entry %q", n)
	}
	for d := path.Dir(n); d != "."; d = path.Dir(d) {
		p, ok := b.entries[d]
		if !ok {
			b.entries[d] = &entry{mode: TypeDir | 0o755}
			continue
		}
		if p.mode&0o170000 != TypeDir {
			return fmt.Errorf("cpio: %q needs %q to be a directory", n, d)
		}
	}
	b.entries[n] = e
	return nil
}

// AddDir adds a directory with permission bits perm.
func (b *Builder) AddDir(name string, perm fs.FileMode) error {
	return b.add(name, &entry{mode: TypeDir | permBits(perm)})
}

// AddFile adds a regular file holding data.
func (b *Builder) AddFile(name string, perm fs.FileMode, data []byte) error {
	return b.add(name, &entry{mode: TypeRegular | permBits(perm), data: data})
}

// AddSymlink adds a symbolic link to target.
func (b *Builder) AddSymlink(name, target string) error {
	if target == "" {
		return fmt.Errorf("cpio: symlink %q with empty target", name)
	}
	return b.add(name, &entry{mode: TypeSymlink | 0o777, data: []byte(target)})
}

// AddCharDev adds a character device node.
func (b *Builder) AddCharDev(name string, perm fs.FileMode, major, minor uint32) error {
	return b.add(name, &entry{mode: TypeChar | permBits(perm), rmaj: major, rmin: minor})
}

// permBits accepts both Go's mode bits (fs.ModeSticky) and the Unix octal
// form (0o1777).
func permBits(m fs.FileMode) uint32 {
	v := uint32(m) & 0o7777
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// less orders paths component by component, so a directory always comes
// right before its own contents.
func less(a, b string) bool {
	as, bs := strings.Split(a, "/"), strings.Split(b, "/")
	for i := 0; i < len(as) && i < len(bs); i++ {
		if as[i] != bs[i] {
			return as[i] < bs[i]
		}
	}
	return len(as) < len(bs)
}

// Names returns the entry names in the order WriteTo writes them.
func (b *Builder) Names() []string {
	names := make([]string, 0, len(b.entries))
	for n := range b.entries {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return less(names[i], names[j]) })
	return names
}

// WriteTo writes the archive, trailer included.
func (b *Builder) WriteTo(w io.Writer) (int64, error) {
	cw := NewWriter(w)
	for _, n := range b.Names() {
		e := b.entries[n]
		h := &Header{Name: n, Mode: e.mode, Size: int64(len(e.data)), RdevMajor: e.rmaj, RdevMinor: e.rmin}
		if err := cw.WriteHeader(h); err != nil {
			return cw.off, err
		}
		if _, err := cw.Write(e.data); err != nil {
			return cw.off, err
		}
	}
	err := cw.Close()
	return cw.off, err
}
