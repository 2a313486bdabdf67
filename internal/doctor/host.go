package doctor

import (
	"context"

	"isopod/internal/image"
	"isopod/internal/vmm"
)

// Host is what the checks read of the host. A nil field is a fact that
// cannot be had; its check says so.
type Host struct {
	// LookPath finds a program, as hosttool.Find.
	LookPath func(name string) (string, error)
	// QEMUVersion returns what `bin -version` prints.
	QEMUVersion func(ctx context.Context, bin string) (string, error)
	// VMM is the core's VMM driver, asked how it would run guests here
	// (sandbox.Service.Prober): its machine and firmware, and its
	// verdict on KVM.
	VMM func(ctx context.Context) (vmm.Prober, error)
	// OpenKVM opens /dev/kvm read-write and closes it.
	OpenKVM func() error
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

// JailInfo is a jail that can be set up.
type JailInfo struct {
	UID, GID int
	// Warnings are fallbacks that weaken it (rlimits for cgroups, the
	// user's own uid).
	Warnings []string
	// Tried: QEMU started and exited in the jail.
	Tried bool
	// Helper is the dedicated helper program that starts each VMM in the
	// jail; "" when isopod re-executes itself instead. PassedOver are the
	// helpers that exist but were not used, and why.
	Helper     string
	PassedOver []string
}

// WarmPool is the warm pool's state.
type WarmPool struct {
	Snapshots int
	Bytes     int64
	// Stale maps a snapshot's key to why no run would use it now.
	Stale map[string]string
}
