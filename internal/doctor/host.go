package doctor

import (
	"context"
	"time"

	"isopod/internal/image"
)

// Host is what the checks read of the host. A nil field is a fact that
// cannot be had; its check says so.
type Host struct {
	// LookPath finds a program, as hosttool.Find.
	LookPath func(name string) (string, error)
	// QEMUVersion returns what `bin -version` prints.
	QEMUVersion func(ctx context.Context, bin string) (string, error)
	// QEMUMachine says which microvm options and firmware a run would
	// start the QEMU binary bin with, and why.
	QEMUMachine func(ctx context.Context, bin string) (QEMUMachine, error)
	// OpenKVM opens /dev/kvm read-write and closes it.
	OpenKVM func() error
	// KVMObstacle says why the VMMs cannot use KVM here (the CPU's flags,
	// /dev/kvm and who may open it) and the fix; empty when nothing rules
	// it out.
	KVMObstacle func(ctx context.Context) (why, fix string)
	// KVMProbe returns the last KVM probe recorded under the state root
	// (ok false: none yet).
	KVMProbe func() (p KVMProbe, ok bool)
	// Jail sets the VMM jail up as a run does (jail.New) and, given the
	// QEMU a run would start ("" for none), starts `qemu -version` in it.
	Jail func(ctx context.Context, qemu string) (JailInfo, error)
	// Kernel resolves the guest kernel (image.ResolveKernel).
	Kernel func() (image.BootKernel, error)
	// Images lists the initramfs and every base (image.ListImages).
	Images func() ([]image.ImageInfo, error)
	// Agent finds the guest agent (image.LocateAgent).
	Agent func() (string, error)
	// FreeBytes is the space free to isopod on the filesystem that holds
	// dir, or its nearest existing parent (at).
	FreeBytes func(dir string) (free uint64, at string, err error)
	// WarmPool lists the warm pool's snapshots.
	WarmPool func(ctx context.Context) (WarmPool, error)
}

// QEMUMachine is how a run starts QEMU's microvm machine.
type QEMUMachine struct {
	// Options is the -machine value; DataDirs are passed with -L.
	Options  string
	DataDirs []string
	// Firmware is the microvm firmware and FirmwareKind which it is
	// (qboot, SeaBIOS, unknown).
	Firmware     string
	FirmwareKind string
	// Why says which firmware and options, and why, in sentences.
	Why string
}

// KVMProbe is the outcome of the last KVM probe.
type KVMProbe struct {
	KVM    bool // QEMU ran a guest under KVM
	Reason string
	At     time.Time
}

// JailInfo is a jail that can be set up.
type JailInfo struct {
	UID, GID int
	// Warnings are fallbacks that weaken it (rlimits for cgroups, the
	// user's own uid).
	Warnings []string
	// Tried: QEMU started and exited in the jail.
	Tried bool
}

// WarmPool is the warm pool's state.
type WarmPool struct {
	Snapshots int
	Bytes     int64
	// Stale maps a snapshot's key to why no run would use it now.
	Stale map[string]string
}
