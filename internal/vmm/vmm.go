// Package vmm is the contract between isopod's core and a virtual machine
// monitor. A [Driver] starts [Machine]s; each Machine is one VMM process that
// runs one guest and never outlives the isopod call that started it.
//
// Vocabulary:
//   - Config: everything needed to boot one guest (kernel, initramfs, disks,
//     NIC, sizes). Validate it before Start.
//   - Agent channel: the byte stream to the guest agent (a virtio-serial port
//     for QEMU, a vsock connection for Firecracker). Framing lives in
//     agentproto; the driver only moves bytes.
//
// Lifecycle: Start returns a running Machine. Wait blocks until the VMM
// process exits and gives every caller the same error. Kill is idempotent and
// safe from any goroutine. A context passed to Start bounds only the start-up;
// it never ends the Machine.
//
// Optional abilities are separate interfaces, found by type assertion:
// [Snapshotter] and [DiskResizer] on a Machine, [Restorer] and [Prober] on
// a Driver.
package vmm

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"time"

	"isopod/internal/errdefs"
)

// Accel is how guest code executes.
type Accel string

const (
	AccelAuto Accel = ""    // KVM when /dev/kvm is usable, else TCG
	AccelKVM  Accel = "kvm" // hardware virtualisation
	AccelTCG  Accel = "tcg" // QEMU's software emulation
)

// Disk is one virtio block device.
type Disk struct {
	Path     string
	ReadOnly bool
	// Serial is what the guest reads from /sys/block/vdX/serial; the agent
	// finds each disk's role by it (at most 20 bytes).
	Serial string
}

// Net attaches one virtio-net NIC.
type Net struct {
	// Socket is a unix stream socket the VMM connects to. Ethernet frames
	// travel on it, each prefixed by its length as a 4-byte big-endian
	// integer (QEMU's stream netdev format). Used by QEMU.
	Socket string
	// Tap is a host tap device name. Used by Firecracker.
	Tap string
	// MAC is the guest NIC's address.
	MAC string
}

// Config describes one guest.
type Config struct {
	ID     string // short identifier, used in process names and logs
	Dir    string // per-VM directory for sockets and logs; must exist
	Kernel string
	// BzImage is the compressed kernel Kernel was taken from ("": Kernel
	// is the only one), for a VMM whose firmware cannot boot Kernel
	// directly in this configuration.
	BzImage string
	Initrd  string
	Cmdline string
	VCPUs   int
	MemMiB  int
	Disks   []Disk
	Net     *Net // nil: no NIC at all
	// SerialLog receives the guest console (kernel and agent logs).
	SerialLog io.Writer
	Accel     Accel
	Logger    *slog.Logger
	// Paused (Restore only): the Machine comes up with the snapshot's
	// state loaded but no guest code running, until its Resume ([Resumer]).
	// A driver that cannot do this refuses the config.
	Paused bool
	// OwnRAM (Restore only): the Machine's guest RAM is a copy of the
	// snapshot's, in memory of its own shared with the host as a booted
	// Machine's is, instead of the snapshot's file mapped copy-on-write.
	// It costs a copy of the snapshot's RAM at restore and leaves the
	// snapshot free to be removed; the Machine can be snapshotted again
	// ([Snapshotter]), which a session's pause needs. A driver that cannot
	// do this refuses the config.
	OwnRAM bool
	// RAMFile (a Start, or a Restore with OwnRAM; "": a memfd, filled
	// from the snapshot at a Restore): the Machine's guest RAM is this
	// file, mapped shared and writable. A Start makes it anew, sparse, of
	// MemMiB. At a Restore without RAMCopy it is taken with no copy. When it is absent or not the snapshot's RAM
	// file, the snapshot's RAM file becomes it (a hard link): the
	// snapshot must be the caller's own (a pause's, a fork's), never one
	// that others restore from. A Snapshot of such a Machine copies its
	// RAM; a SnapshotInPlace ([InPlaceSnapshotter]) links the file itself.
	RAMFile string `json:",omitempty"`
	// RAMCopy (a Restore with OwnRAM and RAMFile): RAMFile is made anew
	// as a copy of the snapshot's RAM (a reflink where the file system
	// allows, else a sparse copy), filled before the guest runs, and the
	// snapshot's file is never written: a snapshot that others restore
	// from (the warm pool's).
	RAMCopy bool `json:",omitempty"`
}

// Validate checks what a driver cannot do without.
func (c *Config) Validate() error {
	switch {
	case c.ID == "":
		return fmt.Errorf("vmm config: empty id: %w", errdefs.ErrInvalidArgument)
	case c.Dir == "" || !filepath.IsAbs(c.Dir):
		return fmt.Errorf("vmm config: dir %q must be absolute: %w", c.Dir, errdefs.ErrInvalidArgument)
	case c.Kernel == "":
		return fmt.Errorf("vmm config: no kernel: %w", errdefs.ErrInvalidArgument)
	case c.VCPUs < 1:
		return fmt.Errorf("vmm config: vcpus %d < 1: %w", c.VCPUs, errdefs.ErrInvalidArgument)
	case c.MemMiB < 64:
		return fmt.Errorf("vmm config: mem %d MiB < 64: %w", c.MemMiB, errdefs.ErrInvalidArgument)
	}
	for _, d := range c.Disks {
		if d.Path == "" || len(d.Serial) > 20 {
			return fmt.Errorf("vmm config: disk %q serial %q: %w", d.Path, d.Serial, errdefs.ErrInvalidArgument)
		}
	}
	if c.Net != nil && c.Net.Socket == "" && c.Net.Tap == "" {
		return fmt.Errorf("vmm config: NIC without socket or tap: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Info describes a VMM build.
type Info struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	Path    string `json:"path"`
}

// Driver starts guests with one VMM.
type Driver interface {
	// Info reports the VMM binary in use.
	Info(ctx context.Context) (Info, error)
	// Start boots a guest. ctx bounds the start-up only.
	Start(ctx context.Context, cfg Config) (Machine, error)
}

// Machine is one running VMM process.
type Machine interface {
	// Agent is the channel to the guest agent. Closing it does not stop the VM.
	Agent() io.ReadWriteCloser
	// Pid is the VMM process id; StartTime its start time in clock ticks
	// since boot (field 22 of /proc/PID/stat), so that a reused pid is never
	// mistaken for it.
	Pid() int
	StartTime() uint64
	// Accel is the acceleration the guest actually runs with.
	Accel() Accel
	// Wait blocks until the VMM exits. Every caller gets the same error.
	Wait() error
	// Done is closed when the VMM has exited.
	Done() <-chan struct{}
	// Kill ends the VMM at once. Idempotent.
	Kill() error
}

// Snapshotter is a Machine that can save its paused state.
type Snapshotter interface {
	// Snapshot pauses the guest and writes its device state and memory under
	// dir. The Machine stays paused; the caller kills it.
	Snapshot(ctx context.Context, dir string) error
}

// SnapshotIdentity is what a snapshot taken by a Driver depends on besides
// the guest: which VMM build made it and the acceleration a boot gets now.
// A snapshot is only restored by a Driver of the same identity.
type SnapshotIdentity struct {
	// VMM names the VMM build (e.g. its binary's path, size and
	// modification time); any change means another build.
	VMM string
	// Accel is the acceleration a boot would get now. It is a prediction
	// that must not boot anything; a snapshot records what it really got.
	Accel Accel
}

// Restorer is a Driver that can start a Machine from a snapshot.
type Restorer interface {
	// SnapshotIdentity reports the driver's identity for snapshot keys,
	// cheaply and without starting a guest.
	SnapshotIdentity(ctx context.Context) (SnapshotIdentity, error)
	// Restore starts a Machine from the snapshot in dir, mapping its memory
	// privately so that many Machines can share one snapshot. cfg supplies
	// the disks, NIC and agent channel for the new Machine; sizes must match
	// the snapshot.
	Restore(ctx context.Context, cfg Config, dir string) (Machine, error)
}

// InPlaceSnapshotter is a Snapshotter that can take a Machine whose guest
// RAM is a file of its own (Config.RAMFile) into a snapshot without a copy:
// the file, flushed to disk, becomes the snapshot's RAM, and the Machine
// must not run again. For a Machine without such a file it is Snapshot.
type InPlaceSnapshotter interface {
	SnapshotInPlace(ctx context.Context, dir string) error
}

// Resumer is a Machine restored with Config.Paused.
type Resumer interface {
	// Resume lets the guest run. Calling it on a running Machine does
	// nothing.
	Resume(ctx context.Context) error
}

// DiskResizer is a Machine whose disks can change size while the guest
// runs.
type DiskResizer interface {
	// ResizeDisk gives Config.Disks[i] the size bytes: its file is cut
	// or grown to it and the guest is told the disk's new size. The VMM
	// refuses the guest's requests past a disk's end, so a disk whose
	// file is smaller than the guest once saw stays as small.
	ResizeDisk(ctx context.Context, i int, bytes int64) error
}

// Timing is optional boot detail a driver may expose (as a Machine).
type Timing interface {
	// Started is when the VMM process was started.
	Started() time.Time
}

// Prober is a Driver that can say, without starting a guest, how it would
// run guests on this host: what `isopod doctor` reports of the VMM.
type Prober interface {
	// AccelVerdict says whether guests here can get hardware acceleration,
	// from what the host says and from the last probe guest recorded.
	AccelVerdict(ctx context.Context) AccelVerdict
	// Machine says which VMM build runs guests and how it starts their
	// machine. An error says, in words, why it cannot start one at all.
	Machine(ctx context.Context) (MachineInfo, error)
}

// AccelVerdict is what a driver tells of hardware acceleration on this
// host. Every text is whole sentences.
type AccelVerdict struct {
	// Obstacle says why what the host says (the CPU, the device node and
	// who may open it, as the driver's VMMs are confined) rules hardware
	// acceleration out; empty when nothing does. Fix says what would
	// allow it.
	Obstacle, Fix string
	// Probe is the last probe guest recorded on this host; nil when none
	// was tried yet (the first boot tries one).
	Probe *AccelProbe
}

// AccelProbe is the outcome of a probe guest under hardware acceleration.
type AccelProbe struct {
	// OK: the guest ran with it. Reason says why not.
	OK     bool
	Reason string
	At     time.Time
}

// MachineInfo is how a driver starts a guest's machine.
type MachineInfo struct {
	// Info is the VMM build.
	Info
	// Options are the machine's options (QEMU: the -machine value), and
	// DataDirs where the VMM is told to read its firmware from.
	Options  string
	DataDirs []string
	// Firmware is the firmware the machine boots and FirmwareKind which
	// it is; empty when the VMM loads the kernel itself.
	Firmware     string
	FirmwareKind string
	// Why says which firmware and options, and why.
	Why string
}
