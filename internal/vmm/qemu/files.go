package qemu

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/jail"
	"isopod/internal/vmm"
)

// Everything a QEMU process reads or talks to arrives as an inherited
// descriptor: the kernel and initramfs (opened by QEMU as /proc/self/fd/N),
// each disk (an fd set), the NIC's connected socket, and guest RAM (a memfd
// the host creates, or for a jailed restore a sealed memfd holding the
// snapshot's RAM). So a jailed QEMU needs nothing of the host's filesystem
// but its own binary, libraries and firmware.

// machineFiles are a machine's inherited descriptors beyond the agent and
// QMP channels (fds 5, 6, ...).
type machineFiles struct {
	files []*os.File
	// mem is the guest RAM memfd of a booted machine, kept for Snapshot.
	mem *os.File
}

// add appends f and returns its descriptor number in QEMU.
func (mf *machineFiles) add(f *os.File) int {
	mf.files = append(mf.files, f)
	return fdQMP + len(mf.files)
}

// closeCopies closes the host's copies once QEMU holds its own; mem stays.
func (mf *machineFiles) closeCopies() {
	for _, f := range mf.files {
		if f != mf.mem {
			f.Close()
		}
	}
	mf.files = nil
}

// closeAll closes everything, mem included. Idempotent.
func (mf *machineFiles) closeAll() {
	mf.closeCopies()
	if mf.mem != nil {
		mf.mem.Close()
		mf.mem = nil
	}
}

func fdPath(n int) string { return "/proc/self/fd/" + strconv.Itoa(n) }

// openFiles opens cfg's kernel, initramfs, disks and NIC and the guest RAM
// for a launch, filling l's descriptor fields. snapshotRAM, for a restore,
// is the snapshot's RAM file.
func (d *Driver) openFiles(cfg *vmm.Config, l *launch, snapshotRAM string) (_ *machineFiles, err error) {
	// Not the named result, which an error return sets to nil before the
	// deferred close runs.
	mf := &machineFiles{}
	defer func() {
		if err != nil {
			mf.closeAll()
		}
	}()
	open := func(path string, flag int) (int, error) {
		f, err := os.OpenFile(path, flag|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
		}
		return mf.add(f), nil
	}
	boot := func(path string) (string, error) {
		f, err := d.bootFile(path)
		if err != nil {
			return "", err
		}
		return fdPath(mf.add(f)), nil
	}
	if l.kernelPath, err = boot(d.kernelFor(cfg)); err != nil {
		return nil, err
	}
	if cfg.Initrd != "" {
		if l.initrdPath, err = boot(cfg.Initrd); err != nil {
			return nil, err
		}
	}
	var n int
	// Each disk is an fd set: QEMU may open a writable disk read-only
	// first and reopen it read-write, so that set holds both.
	l.diskFDs = nil
	for _, disk := range cfg.Disks {
		var set []int
		flags := []int{os.O_RDONLY}
		if !disk.ReadOnly {
			flags = append(flags, os.O_RDWR)
		}
		for _, flag := range flags {
			if n, err = open(disk.Path, flag); err != nil {
				return nil, err
			}
			set = append(set, n)
		}
		l.diskFDs = append(l.diskFDs, set)
	}
	if cfg.Net != nil {
		f, err := dialNet(cfg.Net.Socket)
		if err != nil {
			return nil, err
		}
		l.netFD = mf.add(f)
	}
	return mf, d.openRAM(cfg, l, mf, snapshotRAM)
}

// openRAM provides guest RAM: a fresh memfd for a boot; for a restore the
// snapshot's RAM, privately mapped, from the file itself, or when jailed
// from the file opened read-only (QEMU 8.2 and later) or a sealed memfd
// copy that no process can write.
func (d *Driver) openRAM(cfg *vmm.Config, l *launch, mf *machineFiles, snapshotRAM string) error {
	l.restored = snapshotRAM != ""
	switch {
	case !l.restored:
		fd, err := unix.MemfdCreate("isopod-guest-ram", unix.MFD_CLOEXEC)
		if err != nil {
			return fmt.Errorf("qemu: guest memory: %w", err)
		}
		f := os.NewFile(uintptr(fd), "guest-ram")
		if err := f.Truncate(int64(cfg.MemMiB) << 20); err != nil {
			f.Close()
			return fmt.Errorf("qemu: guest memory: %w", err)
		}
		mf.mem = f
		l.memPath = fdPath(mf.add(f))
	case d.jail == nil:
		l.memPath = snapshotRAM
	default:
		f, err := d.jailedRAM(snapshotRAM, l)
		if err != nil {
			return err
		}
		l.memPath = fdPath(mf.add(f))
	}
	return nil
}

// jailedRAM opens a snapshot's RAM for a jailed QEMU: the file itself when
// the QEMU maps a read-only file as private RAM (l.romOff) and the file's
// mode lets the VMM's uid read it and never write it; else the sealed copy,
// and l.romOff is cleared.
func (d *Driver) jailedRAM(path string, l *launch) (*os.File, error) {
	if l.romOff {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
		}
		if readOnlyFor(f, d.jail.UID()) {
			return f, nil
		}
		f.Close()
		l.romOff = false
	}
	return d.sealed.get(path)
}

// bootFile opens a kernel or initramfs for QEMU, which reopens it by name
// (/proc/self/fd/N), read-only, as its own uid. A jailed QEMU gets the
// file itself where its mode lets that uid read it and never write it
// (what isopod writes, 0644 and not the VMM's, is such a file), and a
// sealed copy otherwise, which it may open whatever the file's mode and
// cannot change either: a copy costs a run tens of milliseconds.
func (d *Driver) bootFile(path string) (*os.File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
	}
	if d.jail == nil || readOnlyFor(f, d.jail.UID()) {
		return f, nil
	}
	f.Close()
	return d.sealed.get(path)
}

// readOnlyFor reports whether a process of uid uid (without capabilities)
// may open f for reading and never for writing: a regular file that is not
// uid's, readable and not writable by its group and by others, whichever
// of the two classes uid falls in.
func readOnlyFor(f *os.File, uid int) bool {
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return false
	}
	sys, ok := st.Sys().(*syscall.Stat_t)
	perm := st.Mode().Perm()
	return ok && int(sys.Uid) != uid && perm&0o044 == 0o044 && perm&0o022 == 0
}

// dialNet connects to the network stack's socket on QEMU's behalf and
// returns the connection as a file to inherit.
func dialNet(socket string) (*os.File, error) {
	c, err := net.Dial("unix", socket)
	if err != nil {
		return nil, fmt.Errorf("qemu: connecting the NIC to %s: %w", socket, err)
	}
	defer c.Close()
	f, err := c.(*net.UnixConn).File()
	if err != nil {
		return nil, fmt.Errorf("qemu: NIC socket: %w", err)
	}
	return f, nil
}

// sealedCache keeps, per file a jailed QEMU opens by name (a snapshot's
// RAM, the kernel, the initramfs), a sealed memfd with its contents: write,
// grow and shrink are sealed, so QEMU may open it read-write (as QEMU 7.2
// insists for RAM it maps privately) whatever the file's own mode, while no
// process, a compromised VMM included, can change what later machines
// read. Built once per process and file version.
type sealedCache struct {
	mu      sync.Mutex // guards following
	entries map[string]sealedEntry
}

type sealedEntry struct {
	id string // the file's identity when copied
	f  *os.File
}

// get returns a descriptor of the sealed copy of path (the caller closes
// it), making the copy when the file is new or changed.
func (c *sealedCache) get(path string) (*os.File, error) {
	src, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
	}
	defer src.Close()
	st, err := src.Stat()
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	id := fileID(st)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.entries == nil {
		c.entries = map[string]sealedEntry{}
	}
	c.evictGone()
	if e, ok := c.entries[path]; ok && e.id == id {
		return dupFile(e.f)
	}
	f, err := sealedCopy(src, st.Size())
	if err != nil {
		return nil, err
	}
	if old, ok := c.entries[path]; ok {
		old.f.Close()
	}
	c.entries[path] = sealedEntry{id: id, f: f}
	return dupFile(f)
}

// evictGone drops copies of files that were removed or replaced.
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

// sealedCopy copies size bytes of src's data (holes stay holes) into a
// new memfd and seals it.
func sealedCopy(src *os.File, size int64) (*os.File, error) {
	fd, err := unix.MemfdCreate("isopod-sealed", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, fmt.Errorf("qemu: sealed copy of %s: %w", src.Name(), err)
	}
	f := os.NewFile(uintptr(fd), "sealed:"+src.Name())
	if err := copyData(f, src, size); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: sealed copy of %s: %w", src.Name(), err)
	}
	seals := unix.F_SEAL_WRITE | unix.F_SEAL_GROW | unix.F_SEAL_SHRINK | unix.F_SEAL_SEAL
	if _, err := unix.FcntlInt(f.Fd(), unix.F_ADD_SEALS, seals); err != nil {
		f.Close()
		return nil, fmt.Errorf("qemu: sealing the copy of %s: %w", src.Name(), err)
	}
	return f, nil
}

// copyData copies the data extents of the first size bytes of src to dst
// at the same offsets and sets dst's size.
func copyData(dst, src *os.File, size int64) error {
	if err := dst.Truncate(size); err != nil {
		return err
	}
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

// jailFiles are the host paths a jailed QEMU reads by name besides its
// firmware (see jailPaths): its shared libraries and its modules (found
// next to the binary, as QEMU looks for them).
func jailFiles(bin string) ([]string, error) {
	files, err := jail.Libraries(bin)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w", err)
	}
	if p := filepath.Join(filepath.Dir(bin), "../lib/x86_64-linux-gnu/qemu"); exists(p) {
		files = append(files, filepath.Clean(p))
	}
	return files, nil
}

// exists reports whether path names something.
func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

// jailPaths are jailFiles and every data directory the machine plan's
// QEMU reads firmware from (its search path, -L directories first).
func jailPaths(files []string, plan *machinePlan) []string {
	out := slices.Clone(files)
	if plan == nil {
		return out
	}
	for _, d := range plan.SearchPath {
		if exists(d) {
			out = append(out, filepath.Clean(d))
		}
	}
	return out
}

// jailSpec is the confinement of one machine; d.machine has run.
func (d *Driver) jailSpec(cfg *vmm.Config, accel vmm.Accel, stdout io.Writer) jail.Spec {
	d.machineMu.Lock()
	plan := d.plan
	d.machineMu.Unlock()
	s := jail.Spec{
		Name:     d.jail.CgroupName(cfg.ID),
		ReadOnly: jailPaths(d.jailFiles, plan),
		Stdout:   stdout,
		Limits: jail.Limits{
			MemoryBytes: int64(cfg.MemMiB)<<20 + vmmOverhead(accel),
			Pids:        vmmPidsMax,
			CPUWeight:   100,
		},
	}
	if accel == vmm.AccelKVM {
		s.Devices = []string{"/dev/kvm"}
	}
	return s
}

// Caps of one jailed QEMU beyond guest RAM: the emulator's translation
// cache and its own memory (larger under TCG), and its threads (vCPUs, I/O
// workers).
const vmmPidsMax = 512

func vmmOverhead(accel vmm.Accel) int64 {
	if accel == vmm.AccelKVM {
		return 256 << 20
	}
	return 768 << 20
}
