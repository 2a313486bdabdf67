package qemu

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"isopod/internal/vmm"
)

// SnapshotIdentity names the QEMU binary by path, size and modification
// time (resolving symlinks) and predicts the accelerator: the forced one,
// else KVM when /dev/kvm opens and the probe cache says KVM boots, else
// TCG. Nothing is run.
func (d *Driver) SnapshotIdentity(ctx context.Context) (vmm.SnapshotIdentity, error) {
	path := d.bin
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	st, err := os.Stat(path)
	if err != nil {
		return vmm.SnapshotIdentity{}, fmt.Errorf("qemu: %w", err)
	}
	id := vmm.SnapshotIdentity{
		VMM:   fmt.Sprintf("qemu %s:%d:%d", path, st.Size(), st.ModTime().UnixNano()),
		Accel: d.expectedAccel(),
	}
	return id, nil
}

// expectedAccel predicts the accelerator of the next boot without probing.
func (d *Driver) expectedAccel() vmm.Accel {
	if d.accel != vmm.AccelAuto {
		return d.accel
	}
	if d.openKVM() != nil {
		return vmm.AccelTCG
	}
	if d.probeCache != "" {
		var rec probeRecord
		if b, err := os.ReadFile(d.probeCache); err == nil && json.Unmarshal(b, &rec) == nil && rec.KVM {
			return vmm.AccelKVM
		}
	}
	return vmm.AccelTCG
}
