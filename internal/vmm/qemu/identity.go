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
// time (resolving symlinks), the machine options and the microvm firmware
// it loads (likewise: a distribution updates the firmware apart from
// QEMU, and a snapshot resumes only into the ROM it was made with), and
// predicts the accelerator: the forced one, else KVM when /dev/kvm opens
// and the probe cache says KVM boots, else TCG. Nothing boots; the
// machine plan is asked of QEMU once per Driver.
func (d *Driver) SnapshotIdentity(ctx context.Context) (vmm.SnapshotIdentity, error) {
	bin, err := fileIdentity(d.bin)
	if err != nil {
		return vmm.SnapshotIdentity{}, err
	}
	plan, err := d.machine(ctx)
	if err != nil {
		return vmm.SnapshotIdentity{}, err
	}
	fw, err := fileIdentity(plan.Firmware)
	if err != nil {
		return vmm.SnapshotIdentity{}, err
	}
	id := vmm.SnapshotIdentity{
		VMM:   fmt.Sprintf("qemu %s machine %s firmware %s", bin, plan.Options, fw),
		Accel: d.expectedAccel(),
	}
	return id, nil
}

// fileIdentity names a file by its real path, size and modification time.
func fileIdentity(path string) (string, error) {
	if real, err := filepath.EvalSymlinks(path); err == nil {
		path = real
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("qemu: %w", err)
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano()), nil
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
