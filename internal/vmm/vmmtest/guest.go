// Package vmmtest is the conformance suite for [vmm.Driver]
// implementations ([Suite]) and its helpers. Every driver, the in-memory
// fake and the real VMMs alike, runs the same suite: boot to the agent
// channel and the agent's Hello, round trips, power-off by the host's Halt,
// Kill, refused configs and, for drivers that can, snapshot and restore.
// The checks that need a real guest kernel (disks by serial, read-only
// disks, data surviving power-off, the kernel console, a garbage kernel
// refused, the VMM process) form an optional part that a driver without one
// skips, saying why.
//
// A real VMM boots a tiny test guest: the pinned kernel plus an initramfs
// whose /init is testdata/guestinit, which serves isopod's agent protocol
// with the agent's own code. The kernel comes from $ISOPOD_TEST_KERNEL and
// its modules from $ISOPOD_TEST_MODULES (the directory holding kernel/...);
// [BuildGuest] skips when they are missing, under -short, or when go is
// not installed.
package vmmtest

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"isopod/internal/image/cpio"
	"isopod/internal/knobs"
)

// Environment knobs for the test guest.
const (
	EnvTestKernel  = "ISOPOD_TEST_KERNEL"
	EnvTestModules = "ISOPOD_TEST_MODULES"
)

// defaultKernel finds the kernel `isopod image fetch-kernel` installed
// under $ISOPOD_HOME (or ~/.isopod) and its modules.
func defaultKernel() (kernel, modules string) {
	home := os.Getenv(knobs.Home)
	if home == "" {
		h, _ := os.UserHomeDir()
		home = filepath.Join(h, ".isopod")
	}
	found, _ := filepath.Glob(filepath.Join(home, "kernels", "*", "vmlinuz"))
	if len(found) == 0 {
		return filepath.Join(home, "kernels", "<none>", "vmlinuz"), ""
	}
	dir := filepath.Dir(found[0])
	return found[0], filepath.Join(dir, "modules")
}

// guestModules are the modules the test guest loads, dependencies first,
// relative to the modules directory. A kernel with them built in needs none:
// missing files are left out.
var guestModules = []string{
	"kernel/drivers/virtio/virtio.ko",
	"kernel/drivers/virtio/virtio_ring.ko",
	"kernel/drivers/virtio/virtio_mmio.ko",
	"kernel/drivers/char/virtio_console.ko",
	"kernel/drivers/block/virtio_blk.ko",
}

// Guest is a bootable test guest.
type Guest struct {
	Kernel string
	Initrd string
}

// BuildGuest locates the kernel and builds the test initramfs in a temporary
// directory. It skips the test when a prerequisite is missing.
func BuildGuest(t *testing.T) Guest {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	defKernel, defModules := defaultKernel()
	kernel := envOr(EnvTestKernel, defKernel)
	modules := envOr(EnvTestModules, defModules)
	if _, err := os.Stat(kernel); err != nil {
		t.Skipf("no test kernel (run `isopod image fetch-kernel` or set %s): %v", EnvTestKernel, err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go toolchain not on PATH; needed to build the test guest")
	}
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "testdata", "guestinit")

	dir := t.TempDir()
	initBin := filepath.Join(dir, "init")
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", initBin, ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building guest init: %v\n%s", err, out)
	}
	initData, err := os.ReadFile(initBin)
	if err != nil {
		t.Fatal(err)
	}
	b := cpio.NewBuilder()
	for _, d := range []string{"etc", "lib/modules", "dev", "proc", "sys"} {
		must(t, b.AddDir(d, 0o755))
	}
	must(t, b.AddFile("init", 0o755, initData))
	var list []string
	for _, m := range guestModules {
		data, err := os.ReadFile(filepath.Join(modules, m))
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		dst := "/lib/modules/" + filepath.Base(m)
		must(t, b.AddFile(dst, 0o644, data))
		list = append(list, dst)
	}
	if len(list) > 0 && len(list) < len(guestModules) {
		t.Skipf("only %d of %d guest modules under %s (set %s)", len(list), len(guestModules), modules, EnvTestModules)
	}
	must(t, b.AddFile("etc/modules", 0o644, []byte(strings.Join(list, "\n")+"\n")))

	initrd := filepath.Join(dir, "initrd.cpio")
	out, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := b.WriteTo(out); err != nil {
		t.Fatalf("writing the initramfs: %v", err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
	return Guest{Kernel: kernel, Initrd: initrd}
}

// PlaceholderGuest is a Guest for a driver that boots no kernel: two small
// files that exist, so that a driver's checks for missing inputs pass.
func PlaceholderGuest(t *testing.T) Guest {
	t.Helper()
	dir := t.TempDir()
	g := Guest{Kernel: filepath.Join(dir, "vmlinuz"), Initrd: filepath.Join(dir, "initrd.cpio")}
	must(t, os.WriteFile(g.Kernel, []byte("not a kernel\n"), 0o644))
	must(t, os.WriteFile(g.Initrd, []byte("not an initramfs\n"), 0o644))
	return g
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
