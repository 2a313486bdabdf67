package agent

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"runtime"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// fifreeze is FIFREEZE, _IOWR('X', 119, int) in the generic ioctl encoding
// (x86 and arm64); golang.org/x/sys does not define it.
const fifreeze = 0xC0045877

// linuxSystem performs machine operations on the running Linux guest.
type linuxSystem struct {
	log *slog.Logger
	// freezeFDs are directories on filesystems to freeze after the final
	// sync (the scratch ext4), which checkpoints the journal and leaves a
	// clean image for the host to commit. -1 entries are skipped.
	freezeFDs []int
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
	return configureNet(s.log, cfg, "/etc/resolv.conf")
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

// SyncDisks syncs every filesystem, then freezes the scratch filesystem so
// its journal is checkpointed and the image is clean when the VM powers
// off. A filesystem that cannot be frozen (tmpfs) is skipped.
func (s *linuxSystem) SyncDisks() error {
	t0 := time.Now()
	unix.Sync()
	for _, fd := range s.freezeFDs {
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
