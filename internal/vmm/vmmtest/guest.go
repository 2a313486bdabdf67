// Package vmmtest is a conformance suite for [vmm.Driver] implementations.
// It builds a tiny test guest (the pinned kernel plus an initramfs whose
// /init is testdata/guestinit) and checks what every driver must do: boot to
// the agent channel, carry bytes both ways, attach disks by serial with
// read-only enforced, keep written data after power-off, copy the console,
// and end its process on Kill.
//
// The kernel comes from $ISOPOD_TEST_KERNEL and its modules from
// $ISOPOD_TEST_MODULES (the directory holding kernel/...); tests skip when
// they are missing, under -short, or when go or cpio is not installed.
package vmmtest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// Environment knobs for the test guest.
const (
	EnvTestKernel  = "ISOPOD_TEST_KERNEL"
	EnvTestModules = "ISOPOD_TEST_MODULES"
)

// Defaults for a Debian cloud kernel unpacked under /tmp/k/x.
const (
	defaultKernel  = "/tmp/k/x/boot/vmlinuz-6.1.0-50-cloud-amd64"
	defaultModules = "/tmp/k/x/lib/modules/6.1.0-50-cloud-amd64"
)

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
	kernel := envOr(EnvTestKernel, defaultKernel)
	modules := envOr(EnvTestModules, defaultModules)
	if _, err := os.Stat(kernel); err != nil {
		t.Skipf("no test kernel (set %s): %v", EnvTestKernel, err)
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go toolchain not on PATH; needed to build the test guest")
	}
	cpio, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio not installed; needed to build the test initramfs")
	}
	_, self, _, _ := runtime.Caller(0)
	src := filepath.Join(filepath.Dir(self), "testdata", "guestinit")

	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	for _, d := range []string{"etc", "lib/modules", "dev", "proc", "sys"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	build := exec.Command(goBin, "build", "-trimpath", "-ldflags=-s -w", "-o", filepath.Join(root, "init"), ".")
	build.Dir = src
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building guest init: %v\n%s", err, out)
	}
	var list []string
	for _, m := range guestModules {
		data, err := os.ReadFile(filepath.Join(modules, m))
		if os.IsNotExist(err) {
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		dst := "/lib/modules/" + filepath.Base(m)
		if err := os.WriteFile(filepath.Join(root, dst), data, 0o644); err != nil {
			t.Fatal(err)
		}
		list = append(list, dst)
	}
	if len(list) > 0 && len(list) < len(guestModules) {
		t.Skipf("only %d of %d guest modules under %s (set %s)", len(list), len(guestModules), modules, EnvTestModules)
	}
	if err := os.WriteFile(filepath.Join(root, "etc/modules"), []byte(strings.Join(list, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	var names bytes.Buffer
	err = filepath.Walk(root, func(p string, _ os.FileInfo, err error) error {
		if err != nil || p == root {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		names.WriteString(rel + "\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	initrd := filepath.Join(dir, "initrd.cpio")
	out, err := os.Create(initrd)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	pack := exec.Command(cpio, "-o", "-H", "newc", "--quiet")
	pack.Dir = root
	pack.Stdin = &names
	pack.Stdout = out
	var stderr bytes.Buffer
	pack.Stderr = &stderr
	if err := pack.Run(); err != nil {
		t.Fatalf("cpio: %v: %s", err, stderr.String())
	}
	return Guest{Kernel: kernel, Initrd: initrd}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
