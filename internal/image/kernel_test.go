package image

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

const realDeb = "/tmp/k/linux-image-6.1.0-50-cloud-amd64_6.1.176-1_amd64.deb"

func needRealDeb(t *testing.T) string {
	t.Helper()
	if _, err := os.Stat(realDeb); err != nil {
		t.Skipf("pinned kernel package not at %s", realDeb)
	}
	return realDeb
}

// fakeKernelFiles is a kernel package that carries a modules.dep.
func fakeKernelFiles(release string) map[string]string {
	m := "lib/modules/" + release + "/"
	return map[string]string{
		"boot/vmlinuz-" + release:                  "KERNEL",
		m + "kernel/drivers/virtio/virtio.ko":      "v",
		m + "kernel/drivers/virtio/virtio_ring.ko": "r",
		m + "kernel/drivers/block/virtio_blk.ko":   "b",
		m + "kernel/drivers/net/unrelated.ko":      "u",
		m + "modules.builtin":                      "kernel/fs/overlayfs/overlay.ko\n",
		m + "modules.dep": "kernel/drivers/virtio/virtio.ko:\n" +
			"kernel/drivers/virtio/virtio_ring.ko:\n" +
			"kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio_ring.ko kernel/drivers/virtio/virtio.ko\n" +
			"kernel/drivers/net/unrelated.ko:\n",
	}
}

// fakeApt writes scripts named apt-get and apt-cache into a directory.
func fakeApt(t *testing.T, getScript, cacheScript string) *Apt {
	t.Helper()
	dir := t.TempDir()
	a := &Apt{GetBin: filepath.Join(dir, "apt-get"), CacheBin: filepath.Join(dir, "apt-cache")}
	for p, body := range map[string]string{a.GetBin: getScript, a.CacheBin: cacheScript} {
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return a
}

func testPaths(t *testing.T) paths.Paths {
	t.Helper()
	p := paths.Paths{Home: t.TempDir()}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestFetchKernelFromRealDeb(t *testing.T) {
	deb := needRealDeb(t)
	if testing.Short() {
		t.Skip("decompresses a 26 MB package")
	}
	paths := testPaths(t)
	ki, err := FetchKernel(context.Background(), paths, FetchOptions{FromDeb: deb})
	if err != nil {
		t.Fatal(err)
	}
	if ki.Cached || !ki.Pinned || ki.KernelRelease != "6.1.0-50-cloud-amd64" || ki.SHA256 != KernelPin.SHA256 {
		t.Errorf("info %+v", ki)
	}
	pos := map[string]int{}
	for i, m := range ki.Modules {
		pos[modName(m)] = i
		if _, err := os.Stat(filepath.Join(ki.Dir, "modules", m)); err != nil {
			t.Errorf("module %s not extracted: %v", m, err)
		}
	}
	for _, w := range append(GuestModules, "net_failover", "failover", "virtio_mmio") {
		if _, ok := pos[w]; !ok {
			t.Errorf("module %s missing from %v", w, ki.Modules)
		}
	}
	for _, pair := range [][2]string{{"virtio", "virtio_blk"}, {"virtio_ring", "virtio_net"}, {"failover", "net_failover"}, {"net_failover", "virtio_net"}, {"vsock", "vmw_vsock_virtio_transport"}, {"vmw_vsock_virtio_transport_common", "vmw_vsock_virtio_transport"}} {
		if pos[pair[0]] >= pos[pair[1]] {
			t.Errorf("%s must load before %s: %v", pair[0], pair[1], ki.Modules)
		}
	}
	order, err := os.ReadFile(filepath.Join(ki.Dir, "modules.order"))
	if err != nil || string(order) != strings.Join(ki.Modules, "\n")+"\n" {
		t.Errorf("modules.order %q, %v", order, err)
	}
	again, err := FetchKernel(context.Background(), paths, FetchOptions{FromDeb: deb})
	if err != nil || !again.Cached {
		t.Errorf("second fetch: cached=%v err=%v", again.Cached, err)
	}
	bk, err := ResolveKernel(paths, "")
	if err != nil {
		t.Fatal(err)
	}
	if bk.BuiltIn || bk.Path != filepath.Join(ki.Dir, "vmlinuz") || len(bk.Modules) != len(ki.Modules) {
		t.Errorf("resolved %+v", bk)
	}

	info, err := BuildInitramfs(context.Background(), paths, BuildOptions{AgentBin: buildStaticBinary(t, t.TempDir(), "agent", "hi")})
	if err != nil {
		t.Fatal(err)
	}
	if info.BuiltInKernel || info.KernelSHA256 != KernelPin.SHA256 || len(info.Modules) != len(ki.Modules) ||
		info.Modules[0] != "/lib/modules/6.1.0-50-cloud-amd64/"+ki.Modules[0] {
		t.Errorf("initramfs %+v", info)
	}
	t.Logf("initramfs with %d modules: %d bytes", len(info.Modules), info.Size)
	boot, err := ResolveBoot(paths, "")
	// The pinned kernel has a PVH entry: a boot uses the uncompressed
	// kernel taken out of its bzImage, kept beside it.
	if err != nil || boot.Kernel != filepath.Join(ki.Dir, VMLinuxName) || filepath.Base(boot.Initramfs) != "initramfs.cpio" {
		t.Errorf("boot %+v %v", boot, err)
	}
}

func TestFetchKernelModulesDep(t *testing.T) {
	tmp := t.TempDir()
	deb := makeDeb(t, tmp, "linux-image-9.9.9-test", "9.9.9-1", fakeKernelFiles("9.9.9-test"))
	paths := testPaths(t)
	ki, err := FetchKernel(context.Background(), paths, FetchOptions{
		FromDeb: deb, AllowUnpinned: true, Modules: []string{"virtio_blk", "overlay"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "kernel/drivers/virtio/virtio.ko,kernel/drivers/virtio/virtio_ring.ko,kernel/drivers/block/virtio_blk.ko"
	if got := strings.Join(ki.Modules, ","); got != want {
		t.Errorf("modules %s; want %s", got, want)
	}
	if ki.Pinned || ki.Version != "9.9.9-1" || ki.Package != "linux-image-9.9.9-test" {
		t.Errorf("info %+v", ki)
	}
	if _, err := os.Stat(filepath.Join(ki.Dir, "modules/kernel/drivers/net/unrelated.ko")); !os.IsNotExist(err) {
		t.Errorf("unneeded module extracted: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(ki.Dir, "vmlinuz")); string(b) != "KERNEL" {
		t.Errorf("vmlinuz %q", b)
	}
}

// TestFetchKernelCompressedModules reads a kernel package the way newer
// Debian kernels ship: an xz data member and modules compressed as .ko.xz.
func TestFetchKernelCompressedModules(t *testing.T) {
	m := "lib/modules/9.9.9-xz/"
	files := map[string]string{
		"boot/vmlinuz-9.9.9-xz":                       "KERNEL",
		m + "kernel/drivers/virtio/virtio.ko.xz":      string(compress(t, ".xz", []byte("virtio module"))),
		m + "kernel/drivers/virtio/virtio_ring.ko.xz": string(compress(t, ".xz", []byte("ring module"))),
		m + "kernel/drivers/block/virtio_blk.ko.xz":   string(compress(t, ".xz", []byte("blk module"))),
		m + "modules.dep": "kernel/drivers/virtio/virtio.ko.xz:\n" +
			"kernel/drivers/virtio/virtio_ring.ko.xz:\n" +
			"kernel/drivers/block/virtio_blk.ko.xz: kernel/drivers/virtio/virtio_ring.ko.xz kernel/drivers/virtio/virtio.ko.xz\n",
	}
	control := "Package: linux-image-9.9.9-xz\nVersion: 9.9.9-1\nArchitecture: amd64\n"
	deb := makeDebWith(t, t.TempDir(), "k.deb", control, ".xz", files)
	ki, err := FetchKernel(t.Context(), testPaths(t), FetchOptions{FromDeb: deb, AllowUnpinned: true, Modules: []string{"virtio_blk"}})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"kernel/drivers/virtio/virtio.ko":      "virtio module",
		"kernel/drivers/virtio/virtio_ring.ko": "ring module",
		"kernel/drivers/block/virtio_blk.ko":   "blk module",
	}
	if len(ki.Modules) != len(want) || ki.Modules[len(ki.Modules)-1] != "kernel/drivers/block/virtio_blk.ko" {
		t.Errorf("modules %v; want virtio_blk last of %d", ki.Modules, len(want))
	}
	for rel, body := range want {
		if b, err := os.ReadFile(filepath.Join(ki.Dir, "modules", rel)); err != nil || string(b) != body {
			t.Errorf("%s: got %q, %v; want %q decompressed", rel, b, err, body)
		}
	}
	if ki.Package != "linux-image-9.9.9-xz" || ki.Version != "9.9.9-1" || ki.KernelRelease != "9.9.9-xz" {
		t.Errorf("info %+v", ki)
	}
}

func TestFromDebDigestMismatch(t *testing.T) {
	deb := makeDeb(t, t.TempDir(), "linux-image-x", "1", fakeKernelFiles("x"))
	sha, _ := sha256File(deb)
	_, err := FetchKernel(context.Background(), testPaths(t), FetchOptions{FromDeb: deb})
	if err == nil {
		t.Fatal("unpinned deb accepted")
	}
	for _, want := range []string{sha, KernelPin.SHA256, "--allow-unpinned"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("error class %s", errdefs.Class(err))
	}
}

func TestDownloadDigestMismatch(t *testing.T) {
	apt := fakeApt(t, `echo bogus > "$PWD/linux-image_1_amd64.deb"`, "exit 1")
	_, err := FetchKernel(context.Background(), testPaths(t), FetchOptions{Apt: apt})
	if err == nil {
		t.Fatal("bogus download accepted")
	}
	got := sha256Bytes([]byte("bogus\n"))
	for _, want := range []string{got, KernelPin.SHA256, "mismatch"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestPinnedVersionNotServed(t *testing.T) {
	for _, msg := range []string{
		"E: Version '6.1.176-1' for 'linux-image-6.1.0-50-cloud-amd64' was not found",
		"E: Unable to locate package linux-image-6.1.0-50-cloud-amd64",
		"E: Can't select candidate version from package linux-image-6.1.0-50-cloud-amd64 as it has no candidate",
	} {
		apt := fakeApt(t, fmt.Sprintf("echo %q >&2; exit 100", msg), "exit 1")
		_, err := FetchKernel(context.Background(), testPaths(t), FetchOptions{Apt: apt})
		if err == nil {
			t.Fatal("no error")
		}
		if !strings.Contains(err.Error(), "--allow-unpinned") || !strings.Contains(err.Error(), "no longer served") {
			t.Errorf("error %q does not explain --allow-unpinned", err)
		}
		if !errors.Is(err, ErrNotServed) || !errors.Is(err, errdefs.ErrFailedPrecondition) {
			t.Errorf("error class %s", errdefs.Class(err))
		}
	}
}

func TestAptMissing(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	_, err := FetchKernel(context.Background(), testPaths(t), FetchOptions{})
	if err == nil || !strings.Contains(err.Error(), "--from-deb FILE") {
		t.Errorf("got %v; want advice to pass --from-deb", err)
	}
}

func TestAllowUnpinnedFollowsMeta(t *testing.T) {
	tmp := t.TempDir()
	deb := makeDeb(t, tmp, "linux-image-9.9.9-cloud", "9.9.9-2", fakeKernelFiles("9.9.9-cloud"))
	sha, _ := sha256File(deb)
	cache := `case "$1 $2" in
"policy linux-image-cloud-amd64") printf 'linux-image-cloud-amd64:\n  Installed: (none)\n  Candidate: 9.9.9-2\n';;
"show linux-image-cloud-amd64=9.9.9-2") printf 'Package: linux-image-cloud-amd64\nVersion: 9.9.9-2\nDepends: linux-image-9.9.9-cloud (= 9.9.9-2)\n\n';;
"show linux-image-9.9.9-cloud=9.9.9-2") printf 'Package: linux-image-9.9.9-cloud\nVersion: 9.9.9-2\nSHA256: ` + sha + `\n\n';;
*) echo "unexpected $*" >&2; exit 1;;
esac`
	get := `cp "` + deb + `" "$PWD/"`
	paths := testPaths(t)
	ki, err := FetchKernel(context.Background(), paths, FetchOptions{Apt: fakeApt(t, get, cache), AllowUnpinned: true, Modules: []string{"virtio_blk"}})
	if err != nil {
		t.Fatal(err)
	}
	if ki.Pinned || ki.Version != "9.9.9-2" || ki.SHA256 != sha || ki.KernelRelease != "9.9.9-cloud" {
		t.Errorf("info %+v", ki)
	}
}

func TestResolveKernel(t *testing.T) {
	paths := testPaths(t)
	if _, err := ResolveKernel(paths, ""); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "fetch-kernel") {
		t.Errorf("no kernel: %v", err)
	}
	k := filepath.Join(t.TempDir(), "bzImage")
	os.WriteFile(k, []byte("k"), 0o644)
	bk, err := ResolveKernel(paths, k)
	if err != nil || !bk.BuiltIn || bk.Path != k || len(bk.Modules) != 0 {
		t.Errorf("custom kernel: %+v %v", bk, err)
	}
	if _, err := ResolveKernel(paths, k+".missing"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing override: %v", err)
	}
}

// TestFetchKernelWithApt downloads the pinned kernel with apt-get.
func TestFetchKernelWithApt(t *testing.T) {
	if testing.Short() {
		t.Skip("downloads the 26 MB kernel package")
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		t.Skip("apt-get not installed")
	}
	paths := testPaths(t)
	ki, err := FetchKernel(context.Background(), paths, FetchOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if !ki.Pinned || ki.SHA256 != KernelPin.SHA256 || len(ki.Modules) == 0 {
		t.Errorf("info %+v", ki)
	}
	leftovers, _ := filepath.Glob(filepath.Join(paths.Kernels(), ".*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}
