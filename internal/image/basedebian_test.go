package image

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestBaseDebianBuild bootstraps the whole base-debian image (minutes, about
// a thousand MB of downloads); it runs only with ISOPOD_TEST_BASE_DEBIAN=1.
func TestBaseDebianBuild(t *testing.T) {
	if os.Getenv("ISOPOD_TEST_BASE_DEBIAN") != "1" {
		t.Skip("set ISOPOD_TEST_BASE_DEBIAN=1 to bootstrap base-debian (takes minutes)")
	}
	needBaseTools(t)
	if os.Geteuid() != 0 {
		t.Skip("debootstrap needs root")
	}
	paths := testPaths(t)
	start := time.Now()
	info, err := BuildBaseDebian(context.Background(), paths, BuildOptions{Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("base-debian: %s, %d bytes, %d packages, built in %s", info.Path, info.Size, len(info.Inputs), time.Since(start).Round(time.Second))
	have := map[string]bool{}
	for _, p := range info.Inputs {
		have[p.Package] = true
		if p.Version == "" {
			t.Errorf("package %s without version", p.Package)
		}
	}
	for _, p := range DebianPackages {
		if !have[p] {
			t.Errorf("package %s not installed", p)
		}
	}
	out, err := exec.Command("unsquashfs", "-lln", info.Path).Output()
	if err != nil {
		t.Fatal(err)
	}
	list := string(out)
	if strings.Contains(list, "EXTERNALLY-MANAGED") {
		t.Error("EXTERNALLY-MANAGED marker left in the image")
	}
	if strings.Contains(list, "var/cache/apt/archives/python3_") {
		t.Error("apt archives not cleaned")
	}
	for _, want := range []string{"/usr/bin/python3", "/usr/bin/node", "/usr/bin/git", "/usr/bin/gcc"} {
		if !strings.Contains(list, "squashfs-root"+want+" ") && !strings.Contains(list, "squashfs-root"+want+"\n") {
			t.Errorf("%s missing", want)
		}
	}
	if _, err := os.Stat(filepath.Join(paths.Images(), "base-debian.json")); err != nil {
		t.Error(err)
	}
	if info2, err := ListImages(paths, "", ""); err != nil {
		t.Error(err)
	} else {
		t.Logf("images: %+v", info2)
	}
}
