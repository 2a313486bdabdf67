package pausefile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// A fork of a VM is a paused copy of it: its snapshot (RAM and device
// state) and, in a VM directory of its own, copies of what the VM writes
// or what goes with it (its scratch disk, its workspace's copy and layer,
// its slots' placeholders), each a reflink where the file system allows
// and a sparse copy otherwise. The read-only layers below (the base and
// the stages) are shared, as between any two runs. The copy's resume
// gives it a boot id of its own besides every resume's fresh entropy,
// clock and network, and its own hostname (its VM's name).

// CopySnapshot copies the snapshot files of the pause in from (all but
// its descriptor) into to, new and empty.
func CopySnapshot(to, from string) error {
	ents, err := os.ReadDir(from)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Name() == File || !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(to, e.Name()), filepath.Join(from, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// CopyFiles copies the files that go with the paused VM p into the VM
// directory dir of its copy, whose id is id, and returns the copy's
// descriptor. What it copied goes again when it fails.
func (p *Paused) CopyFiles(id, dir string) (_ *Paused, retErr error) {
	c := *p
	c.VMID, c.Dir, c.Fork = id, dir, true
	c.Exec.LogDir = dir
	var made []string
	defer func() {
		if retErr != nil {
			for _, f := range made {
				os.Remove(f)
			}
		}
	}()
	// A path of the VM's own names its id as a directory: its VM
	// directory, its workspace's work directory.
	own := func(path string) (string, bool) {
		if path == "" || !strings.Contains(path, "/"+p.VMID+"/") {
			return path, false
		}
		if rest, ok := strings.CutPrefix(path, p.Dir+"/"); ok {
			return filepath.Join(c.Dir, rest), true
		}
		return strings.Replace(path, "/"+p.VMID+"/", "/"+c.VMID+"/", 1), true
	}
	cp := func(path string) (string, error) {
		to, ok := own(path)
		if !ok {
			return path, nil
		}
		if _, err := os.Stat(to); err == nil {
			return to, nil // copied already (a disk and its role)
		}
		if err := os.MkdirAll(filepath.Dir(to), 0o700); err != nil {
			return "", err
		}
		made = append(made, to)
		return to, copyFile(to, path)
	}
	var err error
	c.Config.Disks = append(c.Config.Disks[:0:0], p.Config.Disks...)
	for i := range c.Config.Disks {
		if c.Config.Disks[i].Path, err = cp(p.Config.Disks[i].Path); err != nil {
			return nil, fmt.Errorf("forking the VM's disks: %w", err)
		}
	}
	// The copy's RAM file is its own snapshot's, which its resume takes.
	c.Config.RAMFile, _ = own(p.Config.RAMFile)
	if c.Scratch, err = cp(p.Scratch); err == nil {
		c.WorkspaceUpper, err = cp(p.WorkspaceUpper)
	}
	if err != nil {
		return nil, fmt.Errorf("forking the VM's disks: %w", err)
	}
	return &c, nil
}

// copyFile copies src to a new file dst with its mode and modification
// time: a reflink (FICLONE) where the file system allows, else the data
// extents only, so that holes stay holes.
func copyFile(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, st.Mode().Perm())
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err != nil {
		err = copyExtents(out, in, st.Size())
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// A snapshot's RAM is known by its size and modification time.
		err = os.Chtimes(dst, st.ModTime(), st.ModTime())
	}
	if err != nil {
		os.Remove(dst)
		return fmt.Errorf("copying %s: %w", src, err)
	}
	return nil
}

// copyRange copies bytes [from, to) of src to the same offsets of dst, in
// the kernel where it can.
func copyRange(dst, src *os.File, from, to int64) error {
	for in, out := from, from; in < to; out = in {
		n, err := unix.CopyFileRange(int(src.Fd()), &in, int(dst.Fd()), &out, int(min(to-in, 1<<30)), 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil || n == 0 {
			if err == nil {
				return io.ErrUnexpectedEOF
			}
			_, err = io.Copy(io.NewOffsetWriter(dst, in), io.NewSectionReader(src, in, to-in))
			return err
		}
	}
	return nil
}

// copyExtents copies the data extents of the first size bytes of src to
// the same offsets of dst, and sets dst's size.
func copyExtents(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil
		} else if err != nil {
			return err
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		hole = min(hole, size)
		if err := copyRange(dst, src, data, hole); err != nil {
			return err
		}
		off = hole
	}
	return nil
}
