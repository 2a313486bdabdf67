package qemu

import (
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

// TestConformanceQEMU10: the whole suite passes, jailed, on QEMU 10.
func TestConformanceQEMU10(t *testing.T) {
	vmmtest.Suite(t, vmmtest.Target{
		NewDriver: func(t *testing.T) vmm.Driver { return newQEMU10Driver(t) },
		Guest:     vmmtest.BuildGuest,
	})
}

// TestQEMU10Firmware: the machine plan for QEMU 10 names its firmware and
// keeps option ROMs on under SeaBIOS, and a guest's console shows that
// firmware booted the kernel.
func TestQEMU10Firmware(t *testing.T) {
	d := newQEMU10Driver(t)
	g := vmmtest.BuildGuest(t)
	cfg := vmmtest.Config(t, g)
	s := vmmtest.Boot(t, d, cfg)
	p, err := d.machine(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("-machine %s -L %q: %s", p.Options, p.DataDirs, p.Why)
	if p.Kind == firmwareSeaBIOS && (strings.Contains(p.Options, "x-option-roms=off") || !p.OptionROMs) {
		t.Errorf("SeaBIOS with option ROMs off: %s", p.Options)
	}
	if p.Kind == firmwareSeaBIOS && !strings.Contains(s.Serial.String(), "SeaBIOS") {
		t.Error("the console does not show SeaBIOS")
	}
	if !strings.Contains(s.Serial.String(), "Linux version") {
		t.Error("the console lacks the kernel banner")
	}
}
