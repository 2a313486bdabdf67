package agent

import (
	"errors"
	"fmt"
	"isopod/internal/agentproto"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Guest mount points (see docs/architecture.md, "The guest contract").
const (
	runDir      = "/run/isopod"
	baseMount   = agentproto.BaseMountPoint
	layersDir   = runDir + "/layers"
	scratchDir  = runDir + "/scratch"
	newRootDir  = runDir + "/root"
	baseTimeout = 60 * time.Second
	diskPoll    = 5 * time.Millisecond
)

// bootInfo is what boot learned, reported in Hello.
type bootInfo struct {
	params  bootParams
	err     error // the base could not be mounted
	modules time.Duration
	cgroups *Cgroups
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

// boot performs the PID-1 start-up: kernel filesystems, modules, the base
// image, cgroups, hostname and loopback. The run's root is assembled later,
// when the host sends Mount. Every failure is logged; the ones that leave
// no base are returned in bootInfo.err.
func boot(log *slog.Logger) (bootInfo, *slog.Logger) {
	t0 := time.Now()
	info := bootInfo{}
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
	if err := mountBase(); err != nil {
		log.Error("mounting the base image", "err", err)
		errs = append(errs, err)
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

// mountBase waits for the base image's disk and mounts it read-only.
func mountBase() error {
	found, err := waitDisks("/sys/block", "/dev", []string{SerialBase}, baseTimeout, diskPoll)
	if err != nil {
		return err
	}
	return mountAt(found[SerialBase], baseMount, "squashfs", unix.MS_RDONLY, "")
}

// oneLine joins a multi-line error (errors.Join) with "; ".
func oneLine(err error) string {
	if err == nil {
		return ""
	}
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
