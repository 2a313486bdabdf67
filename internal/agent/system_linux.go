package agent

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// fifreeze is FIFREEZE, _IOWR('X', 119, int) in the generic ioctl encoding
// (x86 and arm64); golang.org/x/sys does not define it.
const fifreeze = 0xC0045877

// fithaw is FITHAW, _IOWR('X', 120, int).
const fithaw = 0xC0045878

// linuxSystem performs machine operations on the running Linux guest.
type linuxSystem struct {
	log *slog.Logger

	mu sync.Mutex // guards following
	// mounted is what the host's Mount set up (nil before).
	mounted *mounted
	// dns is the resolver ConfigureNet last wrote: a root assembled after
	// it (a clone's, after its snapshot configured the network) gets it
	// too.
	dns []string
}

// MountRoot assembles the run's root from the disks m names and switches to
// it; it may run once.
func (s *linuxSystem) MountRoot(m agentproto.Mount) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounted != nil {
		return fmt.Errorf("mount: the root is already assembled")
	}
	mt, err := mountRoot(s.log, m)
	if err != nil {
		return err
	}
	s.mounted = &mt
	if len(s.dns) > 0 {
		if err := writeResolvConf("/etc/resolv.conf", s.dns); err != nil {
			return fmt.Errorf("mount: %w", err)
		}
	}
	return nil
}

// WorkspaceLayers returns the workspace's writable layer's upper directory
// and its original tree ("" when the run has no workspace).
func (s *linuxSystem) WorkspaceLayers() (upper, lower string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounted == nil {
		return "", ""
	}
	return s.mounted.workspaceUpper, s.mounted.workspaceLower
}

var _ System = (*linuxSystem)(nil)

func (s *linuxSystem) SetHostname(name string) error {
	if err := unix.Sethostname([]byte(name)); err != nil {
		return fmt.Errorf("sethostname %q: %w", name, err)
	}
	return nil
}

func (s *linuxSystem) SetClock(t time.Time) error {
	ts := unix.NsecToTimespec(t.UnixNano())
	if err := unix.ClockSettime(unix.CLOCK_REALTIME, &ts); err != nil {
		return fmt.Errorf("clock_settime: %w", err)
	}
	return nil
}

func (s *linuxSystem) ConfigureNet(cfg agentproto.NetConfig) error {
	if err := configureNet(s.log, cfg, "/etc/resolv.conf"); err != nil {
		return err
	}
	s.mu.Lock()
	s.dns = append([]string(nil), cfg.DNS...)
	s.mu.Unlock()
	return nil
}

// AddEntropy credits seed to the kernel's pool (RNDADDENTROPY with a struct
// rand_pool_info) and reseeds the CRNG from it.
func (s *linuxSystem) AddEntropy(seed []byte) error {
	fd, err := unix.Open("/dev/random", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("opening /dev/random: %w", err)
	}
	defer unix.Close(fd)
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	info := make([]byte, 8+len(seed)+3)
	binary.NativeEndian.PutUint32(info[0:4], uint32(8*len(seed)))
	binary.NativeEndian.PutUint32(info[4:8], uint32(len(seed)))
	copy(info[8:], seed)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&info[0])))
	runtime.KeepAlive(info)
	if errno != 0 {
		return fmt.Errorf("ioctl RNDADDENTROPY: %w", errno)
	}
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.RNDRESEEDCRNG, 0); errno != 0 {
		return fmt.Errorf("ioctl RNDRESEEDCRNG: %w", errno)
	}
	return nil
}

// bootIDDir holds the boot id a fork reads, in memory (devtmpfs).
const bootIDDir = "/dev/.isopod-boot-id"

// SetBootID writes id to a file in memory and bind-mounts it over the
// kernel's boot id, which the kernel fixed at its first read and which a
// fork would otherwise share with its parent. A later fork mounts over
// the earlier one.
func (s *linuxSystem) SetBootID(id string) error {
	if err := os.MkdirAll(bootIDDir, 0o755); err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	f, err := os.CreateTemp(bootIDDir, "boot_id-")
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	_, err = f.WriteString(id + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o444)
	}
	if err == nil {
		err = unix.Mount(f.Name(), "/proc/sys/kernel/random/boot_id", "", unix.MS_BIND, "")
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("boot id: %w", err)
	}
	return nil
}

// SyncDisks takes the workspace out of the root (its mount point must not
// be committed), syncs every filesystem, then freezes the scratch
// filesystem so its journal is checkpointed and the image is clean when the
// VM powers off. A filesystem that cannot be frozen (tmpfs) is skipped.
func (s *linuxSystem) SyncDisks() error {
	t0 := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	var freeze []int
	if s.mounted != nil {
		if err := s.mounted.unmountWorkspace(); err != nil {
			return err
		}
		freeze = append(freeze, s.mounted.scratchFD)
	}
	unix.Sync()
	for _, fd := range freeze {
		if fd < 0 {
			continue
		}
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fifreeze, 0)
		switch {
		case errno == 0, errno == unix.EBUSY: // EBUSY: already frozen
		case errno == unix.EOPNOTSUPP || errno == unix.ENOTTY:
			s.log.Debug("filesystem cannot be frozen; synced only", "fd", fd)
		default:
			return fmt.Errorf("freezing the scratch filesystem: %w", errno)
		}
	}
	s.log.Info("disks synced", "ms", time.Since(t0).Milliseconds())
	return nil
}

// FreezeScratch freezes the scratch filesystem: the kernel writes its
// dirty data out and checkpoints its journal, so that its disk image is
// clean, and blocks writes to it until ThawScratch. A syncfs first writes
// most dirty data out while writes still go on, so that the freeze itself
// holds them for less.
func (s *linuxSystem) FreezeScratch() error {
	fd, err := s.scratchFD()
	if err != nil {
		return err
	}
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("syncing the scratch filesystem: %w", err)
	}
	return freezeFD(fd)
}

// ThawScratch ends FreezeScratch's freeze.
func (s *linuxSystem) ThawScratch() error {
	fd, err := s.scratchFD()
	if err != nil {
		return err
	}
	return thawFD(fd)
}

func (s *linuxSystem) scratchFD() (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mounted == nil || s.mounted.scratchFD < 0 {
		return -1, fmt.Errorf("the root has no scratch disk to freeze: %w", errdefs.ErrFailedPrecondition)
	}
	return s.mounted.scratchFD, nil
}

// freezeFD freezes the filesystem of the open file fd (FIFREEZE).
func freezeFD(fd int) error {
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fifreeze, 0)
	switch errno {
	case 0:
		return nil
	case unix.EBUSY:
		return fmt.Errorf("freezing the scratch filesystem: it is already frozen: %w", errdefs.ErrFailedPrecondition)
	case unix.EOPNOTSUPP, unix.ENOTTY:
		return fmt.Errorf("freezing the scratch filesystem: %w: %w", errno, errdefs.ErrNotSupported)
	}
	return fmt.Errorf("freezing the scratch filesystem: %w", errno)
}

// thawFD thaws the filesystem of the open file fd (FITHAW).
func thawFD(fd int) error {
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), fithaw, 0); errno != 0 {
		return fmt.Errorf("thawing the scratch filesystem: %w", errno)
	}
	return nil
}
