package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/vmm"
)

// TestSnapshotIdentity: the VMM identity names the binary and follows its
// size and time; a forced accelerator is what the identity predicts.
func TestSnapshotIdentity(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "qemu-system-x86_64")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	d, err := New(Config{Binary: bin, Accel: vmm.AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	before, err := d.SnapshotIdentity(context.Background())
	if err != nil || !strings.Contains(before.VMM, bin) || before.Accel != vmm.AccelTCG {
		t.Fatalf("identity %+v (%v); want it to name %s under tcg", before, err, bin)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n# rebuilt\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if after, _ := d.SnapshotIdentity(context.Background()); after.VMM == before.VMM {
		t.Errorf("identity %q did not change with the binary", after.VMM)
	}
	// Without /dev/kvm an automatic driver predicts tcg.
	d.accel = vmm.AccelAuto
	d.openKVM = func() error { return os.ErrNotExist }
	if a := d.expectedAccel(); a != vmm.AccelTCG {
		t.Errorf("auto without kvm predicts %q", a)
	}
}
