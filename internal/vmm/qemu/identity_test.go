package qemu

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/vmm"
)

// TestSnapshotIdentity: the VMM identity names the binary, its machine
// options and its firmware, and follows the binary's and the firmware's
// size and time; a forced accelerator is what the identity predicts.
func TestSnapshotIdentity(t *testing.T) {
	dir := t.TempDir()
	bin, fw := filepath.Join(dir, "qemu-system-x86_64"), filepath.Join(dir, "bios-microvm.bin")
	for _, f := range []string{bin, fw} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	d, err := New(Config{Binary: bin, Accel: vmm.AccelTCG})
	if err != nil {
		t.Fatal(err)
	}
	d.machineProbe = func(context.Context, string) (machineFacts, error) {
		return machineFacts{Bin: bin, Microvm: helpProps(microvmHelp), Firmware: fw, Kind: firmwareSeaBIOS}, nil
	}
	before, err := d.SnapshotIdentity(context.Background())
	if err != nil || !strings.Contains(before.VMM, bin) || !strings.Contains(before.VMM, fw) ||
		!strings.Contains(before.VMM, "microvm,acpi=on") || before.Accel != vmm.AccelTCG {
		t.Fatalf("identity %+v (%v); want it to name %s, %s and the options under tcg", before, err, bin, fw)
	}
	for _, f := range []string{bin, fw} {
		if err := os.WriteFile(f, []byte("#!/bin/sh\n# rebuilt\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		after, _ := d.SnapshotIdentity(context.Background())
		if after.VMM == before.VMM {
			t.Errorf("identity %q did not change with %s", after.VMM, f)
		}
		before = after
	}
	// Without /dev/kvm an automatic driver predicts tcg.
	d.accel = vmm.AccelAuto
	d.openKVM = func() error { return os.ErrNotExist }
	if a := d.expectedAccel(); a != vmm.AccelTCG {
		t.Errorf("auto without kvm predicts %q", a)
	}
}
