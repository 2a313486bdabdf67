package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/vmrecord"
)

// Forking a held VM makes a paused copy of it for another session to
// resume (ResumeVM): its snapshot (RAM and device state) and, in a VM
// directory of its own, copies of what the VM writes or what goes with
// it (its scratch disk, its workspace's copy and layer, its slots'
// placeholders), each a reflink where the file system allows and a
// sparse copy otherwise. The read-only layers below (the base and the
// stages) are shared, as between any two runs. The copy's resume gives it
// a boot id of its own besides every resume's fresh entropy, clock and
// network, and its own hostname (its VM's name).

// Fork snapshots the running held VM into dir (new and empty) for a
// copy, which ResumeVM brings up; the VM is stopped while its RAM and
// disks are copied, then runs on.
func (h *Held) Fork(ctx context.Context, dir string) error {
	r := h.r
	id, err := r.s.identity(ctx, r.vmCfg)
	if err != nil {
		return err
	}
	p := h.descriptor(id)
	err = r.vm.SnapshotRunning(ctx, dir, func() error {
		child, err := r.s.copyVM(&p)
		if err != nil {
			return err
		}
		return writeCopy(dir, child)
	})
	if err != nil {
		return fmt.Errorf("forking the VM: %w", err)
	}
	return nil
}

// ForkPaused copies the pause in parentDir (Held.Pause) into dir (new and
// empty) for a copy of that VM, which ResumeVM brings up.
func (s *Service) ForkPaused(parentDir, dir string) error {
	p, err := ReadPaused(parentDir)
	if err != nil {
		return err
	}
	ents, err := os.ReadDir(parentDir)
	if err != nil {
		return fmt.Errorf("forking the paused VM: %w", err)
	}
	for _, e := range ents {
		if e.Name() == pausedFile || !e.Type().IsRegular() {
			continue
		}
		if err := copyFile(filepath.Join(dir, e.Name()), filepath.Join(parentDir, e.Name())); err != nil {
			return fmt.Errorf("forking the paused VM: %w", err)
		}
	}
	child, err := s.copyVM(p)
	if err != nil {
		return err
	}
	return writeCopy(dir, child)
}

// writeCopy writes the descriptor of the copy c into dir, or removes
// what was copied for it.
func writeCopy(dir string, c *PausedVM) error {
	if err := writePaused(dir, c); err != nil {
		discard(c)
		os.RemoveAll(c.Dir)
		return fmt.Errorf("forking the VM: %w", err)
	}
	return nil
}

// copyVM makes the VM directory of a copy of the VM p describes, with
// copies of the files that go with it, and returns the copy's
// descriptor.
func (s *Service) copyVM(p *PausedVM) (_ *PausedVM, retErr error) {
	rec, err := vmrecord.Read(p.Dir)
	if err != nil {
		return nil, fmt.Errorf("forking the VM: %w", err)
	}
	d, err := vmrecord.NewDir(s.opts.Paths, heldArgv, rec.Base, rec.Stage)
	if err != nil {
		return nil, err
	}
	var made []string
	defer func() {
		d.Pause()
		if retErr != nil {
			for _, f := range made {
				os.Remove(f)
			}
			os.RemoveAll(d.Path())
		}
	}()
	c := *p
	c.VMID, c.Dir, c.Fork = d.Rec.ID, d.Path(), true
	c.Exec.LogDir = d.Path()
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
	c.Config.Disks = append(c.Config.Disks[:0:0], p.Config.Disks...)
	for i := range c.Config.Disks {
		if c.Config.Disks[i].Path, err = cp(p.Config.Disks[i].Path); err != nil {
			return nil, fmt.Errorf("forking the VM's disks: %w", err)
		}
	}
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
