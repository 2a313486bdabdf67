package agent

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Guest mount points (see docs/architecture.md, "The guest contract").
const (
	runDir      = "/run/isopod"
	baseMount   = runDir + "/base"
	layersDir   = runDir + "/layers"
	scratchDir  = runDir + "/scratch"
	newRootDir  = runDir + "/root"
	diskTimeout = 5 * time.Second
	diskPoll    = 5 * time.Millisecond
)

// bootInfo is what boot learned, reported in Hello.
type bootInfo struct {
	params    bootParams
	err       error // the root could not be assembled as asked
	modules   time.Duration
	scratchFD int // directory on the scratch filesystem, for freezing; -1 if none
	cgroups   *Cgroups
}

// mountAt creates target and mounts on it, with an error naming all parts.
func mountAt(src, target, fstype string, flags uintptr, data string) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("mount %s: %w", target, err)
	}
	if err := unix.Mount(src, target, fstype, flags, data); err != nil {
		return fmt.Errorf("mount %s (%s) on %s with %q: %w", src, fstype, target, data, err)
	}
	return nil
}

// mountKernelFS mounts /dev, /proc and /sys; already mounted is fine.
func mountKernelFS() error {
	var errs []error
	for _, m := range []struct{ src, target, fstype, data string }{
		{"devtmpfs", "/dev", "devtmpfs", "mode=0755"},
		{"proc", "/proc", "proc", ""},
		{"sysfs", "/sys", "sysfs", ""},
	} {
		err := mountAt(m.src, m.target, m.fstype, unix.MS_NOSUID, m.data)
		if err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// attachConsole points stdin, stdout and stderr at /dev/console, so log
// lines reach the serial console even when the kernel could not open it
// before starting init.
func attachConsole() {
	fd, err := unix.Open("/dev/console", unix.O_RDWR|unix.O_NOCTTY, 0)
	if err != nil {
		return
	}
	for i := 0; i < 3; i++ {
		if fd != i {
			unix.Dup3(fd, i, 0)
		}
	}
	if fd > 2 {
		unix.Close(fd)
	}
}

// assembleRoot mounts the disks and the overlay at newRootDir. On a partial
// failure it still builds what it can (a tmpfs upper when the scratch disk
// is missing) and returns the error; it returns ok=false only when there is
// no root to switch to.
func assembleRoot(log *slog.Logger, p bootParams) (scratchFD int, ok bool, err error) {
	scratchFD = -1
	var errs []error
	want := diskWant{layers: p.layers, scratch: !p.ramUpper}
	t0 := time.Now()
	found, werr := waitDisks("/sys/block", "/dev", want, diskTimeout, diskPoll)
	if werr != nil {
		log.Error("waiting for disks", "err", werr)
		errs = append(errs, werr)
	}
	log.Info("disks found", "ms", time.Since(t0).Milliseconds(), "disks", describeFound(found))

	base, haveBase := found[SerialBase]
	if !haveBase {
		return -1, false, errors.Join(errs...)
	}
	if err := mountAt(base, baseMount, "squashfs", unix.MS_RDONLY, ""); err != nil {
		return -1, false, errors.Join(append(errs, err)...)
	}

	devs, lerr := layerDevices(found, want)
	if lerr != nil {
		errs = append(errs, lerr)
	}
	var layerMounts []string
	for i, dev := range devs {
		target := filepath.Join(layersDir, strconv.Itoa(i))
		if err := mountAt(dev, target, "ext4", unix.MS_RDONLY|unix.MS_NOATIME, ""); err != nil {
			errs = append(errs, fmt.Errorf("stage layer %d: %w", i, err))
			break // an upper layer without the ones below would be wrong
		}
		layerMounts = append(layerMounts, target)
	}

	scratch, haveScratch := found[SerialScratch]
	switch {
	case p.ramUpper:
		haveScratch = false
	case !haveScratch:
		errs = append(errs, errors.New("no scratch disk; writes go to memory and cannot be committed"))
	}
	if haveScratch {
		if err := mountAt(scratch, scratchDir, "ext4", unix.MS_NOATIME, ""); err != nil {
			errs = append(errs, fmt.Errorf("scratch disk: %w", err))
			haveScratch = false
		}
	}
	if !haveScratch {
		if err := mountAt("tmpfs", scratchDir, "tmpfs", unix.MS_NOATIME, "mode=0755"); err != nil {
			return -1, false, errors.Join(append(errs, err)...)
		}
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.MkdirAll(filepath.Join(scratchDir, d), 0o755); err != nil {
			return -1, false, errors.Join(append(errs, fmt.Errorf("scratch: %w", err))...)
		}
	}
	if haveScratch {
		if fd, err := unix.Open(scratchDir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err == nil {
			scratchFD = fd
		}
	}

	lower, skipped := lowerDirs(layerMounts, baseMount)
	for _, s := range skipped {
		log.Info("stage layer has no upper directory; skipped", "layer", s)
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s/upper,workdir=%s/work", lower, scratchDir, scratchDir)
	if err := mountAt("overlay", newRootDir, "overlay", 0, opts); err != nil {
		return scratchFD, false, errors.Join(append(errs, err)...)
	}
	log.Info("root assembled", "layers", len(layerMounts), "ram_upper", !haveScratch)
	return scratchFD, true, errors.Join(errs...)
}

// switchRoot makes newRoot the root: the initramfs rootfs cannot be
// pivot_root'ed, so the kernel filesystems are moved into the new root,
// which is then moved over "/" and chrooted into.
func switchRoot(newRoot string) error {
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		target := filepath.Join(newRoot, d)
		if err := os.MkdirAll(target, 0o755); err != nil {
			return fmt.Errorf("switch root: %w", err)
		}
		if err := unix.Mount(d, target, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("switch root: moving %s to %s: %w", d, target, err)
		}
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("switch root: chdir %s: %w", newRoot, err)
	}
	if err := unix.Mount(newRoot, "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("switch root: moving %s onto /: %w", newRoot, err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("switch root: chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("switch root: chdir /: %w", err)
	}
	return nil
}

// finishRoot mounts the runtime filesystems of the final root and creates
// the directories and /dev links programs expect.
func finishRoot() error {
	var errs []error
	for _, m := range []struct {
		src, target, fstype string
		flags               uintptr
		data                string
		mode                os.FileMode
	}{
		{"tmpfs", "/tmp", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
		{"tmpfs", "/run", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=0755", 0o755},
		{"devpts", "/dev/pts", "devpts", unix.MS_NOSUID | unix.MS_NOEXEC, "mode=0620,ptmxmode=0666,gid=5", 0o755},
		{"tmpfs", "/dev/shm", "tmpfs", unix.MS_NOSUID | unix.MS_NODEV, "mode=1777", 0o1777},
	} {
		if err := mountAt(m.src, m.target, m.fstype, m.flags, m.data); err != nil && !errors.Is(err, unix.EBUSY) {
			errs = append(errs, err)
		}
	}
	for dir, mode := range map[string]os.FileMode{"/root": 0o700, "/etc": 0o755} {
		if _, err := os.Lstat(dir); err != nil {
			if err := os.Mkdir(dir, mode); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for link, target := range map[string]string{
		"/dev/fd":     "/proc/self/fd",
		"/dev/stdin":  "/proc/self/fd/0",
		"/dev/stdout": "/proc/self/fd/1",
		"/dev/stderr": "/proc/self/fd/2",
	} {
		if _, err := os.Lstat(link); err != nil {
			if err := os.Symlink(target, link); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// boot performs the PID-1 start-up. Every failure is logged; the ones that
// leave the root not as the host asked are returned in bootInfo.err.
func boot(log *slog.Logger) (bootInfo, *slog.Logger) {
	t0 := time.Now()
	info := bootInfo{scratchFD: -1}
	var errs []error
	if err := mountKernelFS(); err != nil {
		log.Error("mounting kernel filesystems", "err", err)
		errs = append(errs, err)
	}
	attachConsole()
	params, perrs := readCmdline("/proc/cmdline")
	info.params = params
	if params.debug {
		log = NewConsoleLogger(os.Stderr, true)
	}
	for _, e := range perrs {
		log.Warn("kernel command line", "err", e)
	}
	d, merr := loadModules(log, ModulesList)
	info.modules = d

	fd, ok, rerr := assembleRoot(log, params)
	info.scratchFD = fd
	if rerr != nil {
		errs = append(errs, rerr)
	}
	if ok {
		if err := switchRoot(newRootDir); err != nil {
			log.Error("switching root", "err", err)
			errs = append(errs, err)
		}
	} else {
		log.Error("no root filesystem; staying in the initramfs")
	}
	if err := finishRoot(); err != nil {
		log.Warn("preparing the root", "err", err)
	}
	cg, err := setupCgroups(log)
	if err != nil {
		// Commands still run, unconfined; the console says why.
		log.Error("confining commands in cgroups", "err", err)
	}
	info.cgroups = cg
	if params.hostname != "" {
		if err := unix.Sethostname([]byte(params.hostname)); err != nil {
			log.Warn("setting hostname", "err", err)
		}
	}
	if err := loopbackUp(); err != nil {
		log.Warn("bringing loopback up", "err", err)
	}
	if len(errs) > 0 {
		if merr != nil {
			errs = append(errs, merr) // a module failure may explain the rest
		}
		info.err = errors.Join(errs...)
		log.Error("boot failed; serving anyway so the host can report it", "err", oneLine(info.err))
	}
	log.Info("boot done", "ms", time.Since(t0).Milliseconds(), "uptime_ms", uptimeMS())
	return info, log
}

// oneLine joins a multi-line error (errors.Join) with "; ".
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
