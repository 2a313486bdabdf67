package qemu

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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
	// mem is the guest RAM memfd of a booted machine, kept for Snapshot,
	// or the RAM file of a machine with one (ramFile set).
	mem     *os.File
	ramFile bool
	// ramReady, when set, waits until the restored guest RAM (a sealed
	// copy filled while QEMU starts) is complete; see sealedCache.
	ramReady func() error
}

// waitRAM waits until guest RAM is complete and sealed: before anything
// runs the guest or reads its RAM.
func (mf *machineFiles) waitRAM() error {
	if mf.ramReady == nil {
		return nil
	}
	return mf.ramReady()
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

// openRAM provides guest RAM: the machine's own RAM file where it has one
// (ramfile.go); else a fresh memfd for a boot; for a restore the
// snapshot's RAM, privately mapped, from the file itself, or when jailed
// from the file opened read-only (QEMU 8.2 and later) or a sealed memfd
// copy that no process can write.
func (d *Driver) openRAM(cfg *vmm.Config, l *launch, mf *machineFiles, snapshotRAM string) error {
	l.restored = snapshotRAM != ""
	switch {
	case cfg.RAMFile != "" && (!l.restored || cfg.OwnRAM):
		return d.ramFile(cfg, l, mf, snapshotRAM)
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
		l.ramFrom = "memfd"
	case cfg.OwnRAM:
		return fmt.Errorf("qemu: a restore with RAM of its own needs its RAM file (vmm.Config.RAMFile): %w", errdefs.ErrInvalidArgument)
	case d.jail == nil:
		l.memPath = snapshotRAM
		l.ramFrom = "snapshot file"
	default:
		f, ready, err := d.jailedRAM(snapshotRAM, l)
		if err != nil {
			return err
		}
		mf.ramReady = ready
		l.memPath = fdPath(mf.add(f))
	}
	return nil
}

// jailedRAM opens a snapshot's RAM for a jailed QEMU: the file itself when
// the QEMU maps a read-only file as private RAM (l.romOff) and the file's
// mode lets the VMM's uid read it and never write it; else the sealed copy,
// which ready (not nil then) waits for, and l.romOff is cleared.
func (d *Driver) jailedRAM(path string, l *launch) (_ *os.File, ready func() error, _ error) {
	if l.romOff {
		f, err := os.Open(path)
		if err != nil {
			return nil, nil, fmt.Errorf("qemu: %w: %w", err, errdefs.ErrNotFound)
		}
		if readOnlyFor(f, d.jail.UID()) {
			l.ramFrom = "snapshot file, read-only"
			return f, nil, nil
		}
		f.Close()
		l.romOff = false
	}
	l.ramFrom = "sealed copy"
	return d.sealed.start(path)
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

// jailFiles are the host paths a jailed QEMU reads by name besides its
// firmware (see jailPaths): its shared libraries and its modules (found
// next to the binary, as QEMU looks for them).
func jailFiles(bin string, cache factsCache) ([]string, error) {
	files, err := cache.cachedLibraries(bin, jail.Libraries)
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
