package qemu

import (
	"os/exec"
	"testing"

	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

// newTestDriver returns a Driver on the installed QEMU or skips.
func newTestDriver(t *testing.T) *Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		t.Skipf("%s not installed", DefaultBinary)
	}
	d, err := New(Config{ProbeCache: t.TempDir() + "/kvmprobe.json"})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	vmmtest.Suite(t, func(t *testing.T) vmm.Driver { return newTestDriver(t) })
}
