package qemu

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"isopod/internal/jail"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

// newQEMU10Driver returns a jailed Driver on QEMU 10, which boots microvm
// with SeaBIOS (Debian 13's QEMU, and Debian 12's backport of it unpacked
// beside the system's by scripts/fetch-qemu-backports.sh), or skips.
func newQEMU10Driver(t *testing.T) *Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	bin := vmmtest.QEMU10(t)
	j, err := jail.New(jail.Config{})
	if err != nil {
		t.Skipf("no jail on this host: %v", err)
	}
	d, err := New(Config{Binary: bin, ProbeCache: probeCache, Logger: testLogger(t), Jail: j})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformanceQEMU10: the whole suite passes, jailed, on QEMU 10,
// whose microvm firmware (SeaBIOS as Debian ships it) gets option ROMs.
func TestConformanceQEMU10(t *testing.T) {
	var d *Driver
	vmmtest.Suite(t, vmmtest.Target{
		NewDriver: func(t *testing.T) vmm.Driver { d = newQEMU10Driver(t); return d },
		Guest:     vmmtest.BuildGuest,
	})
	p, err := d.machine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("-machine %s -L %q: %s", p.Options, p.DataDirs, p.Why)
	if p.Kind == firmwareSeaBIOS && (strings.Contains(p.Options, "x-option-roms=off") || !p.OptionROMs) {
		t.Errorf("SeaBIOS with option ROMs off: %s", p.Options)
	}
	if !p.ROMOff {
		t.Error("QEMU 10's memory-backend-file has no rom=: jailed restores take the sealed copy")
	}
	// Unpacked away from /usr, it reads its own data directories.
	own := filepath.Join(filepath.Dir(d.bin), "../share/qemu")
	if !strings.HasPrefix(d.bin, "/usr/") && exists(own) && !slices.Contains(p.DataDirs, own) {
		t.Errorf("-L %q lacks %s", p.DataDirs, own)
	}
}
