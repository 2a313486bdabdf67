package vmmtest

import (
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
)

// EnvTestQEMU10 names a QEMU 10 binary for the tests that run isopod on
// it; default DefaultQEMU10, where scripts/fetch-qemu-backports.sh
// unpacks Debian's backport beside the system's QEMU.
const EnvTestQEMU10 = "ISOPOD_TEST_QEMU10"

// DefaultQEMU10 is where scripts/fetch-qemu-backports.sh puts the binary.
const DefaultQEMU10 = "/opt/isopod-qemu-backports/usr/bin/qemu-system-x86_64"

var qemuVersionRE = regexp.MustCompile(`version ([0-9]+)\.([0-9]+)`)

// QEMU10 returns the QEMU 10 (or newer) binary to test with, or skips
// saying how to get one.
func QEMU10(t testing.TB) string {
	t.Helper()
	bin, from := os.Getenv(EnvTestQEMU10), "$"+EnvTestQEMU10
	if bin == "" {
		bin, from = DefaultQEMU10, DefaultQEMU10
	}
	if _, err := os.Stat(bin); err != nil {
		t.Skipf("no QEMU 10 at %s (%v): run scripts/fetch-qemu-backports.sh, which unpacks Debian's backport there, or set %s", from, err, EnvTestQEMU10)
	}
	out, err := exec.Command(bin, "-version").Output()
	if err != nil {
		t.Fatalf("%s -version: %v", bin, err)
	}
	m := qemuVersionRE.FindStringSubmatch(string(out))
	if m == nil {
		t.Fatalf("%s -version printed no version: %q", bin, out)
	}
	if major, _ := strconv.Atoi(m[1]); major < 10 {
		t.Skipf("%s is QEMU %s.%s, not 10 or newer: run scripts/fetch-qemu-backports.sh", bin, m[1], m[2])
	}
	return bin
}
