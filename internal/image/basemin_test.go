package image

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
)

func needBaseTools(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("downloads packages from a Debian mirror and runs mksquashfs")
	}
	for _, tool := range []string{"mksquashfs", "unsquashfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed", tool)
		}
	}
}

func TestBaseMinReproducible(t *testing.T) {
	needBaseTools(t)
	ctx := context.Background()
	var images [2][]byte
	var infos [2]BaseInfo
	for i := range images {
		paths := testPaths(t)
		info, err := BuildBaseMin(ctx, paths, BuildOptions{Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if info.Cached {
			t.Fatal("fresh home reported a cached image")
		}
		if images[i], err = os.ReadFile(info.Path); err != nil {
			t.Fatal(err)
		}
		infos[i] = info
		if i == 0 {
			again, err := BuildBaseMin(ctx, paths, BuildOptions{})
			if err != nil || !again.Cached || again.ContentSHA256 != info.ContentSHA256 {
				t.Errorf("second build in the same home: cached=%v err=%v", again.Cached, err)
			}
			checkBaseMinTree(t, info.Path)
		}
	}
	if !bytes.Equal(images[0], images[1]) {
		t.Fatalf("two builds differ: %s vs %s", infos[0].ContentSHA256, infos[1].ContentSHA256)
	}
	if infos[0].ContentSHA256 != sha256Bytes(images[0]) || infos[0].Inputs[0] != BusyboxPin {
		t.Errorf("sidecar %+v", infos[0])
	}
}

// checkBaseMinTree lists the image with unsquashfs and checks the paths and
// modes the guest relies on.
func checkBaseMinTree(t *testing.T, img string) {
	t.Helper()
	out, err := exec.Command("unsquashfs", "-lln", img).Output()
	if err != nil {
		t.Fatalf("unsquashfs: %v", err)
	}
	modes := map[string]string{}
	for _, l := range strings.Split(string(out), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 {
			continue
		}
		p := strings.TrimPrefix(f[5], "squashfs-root")
		modes[p] = f[0] + " " + f[1]
		if f[1] != "0/0" {
			t.Errorf("%s owned by %s", p, f[1])
		}
	}
	for p, want := range map[string]string{
		"/bin/busybox": "-rwxr-xr-x", "/bin/sh": "lrwxrwxrwx", "/root": "drwx------",
		"/tmp": "drwxrwxrwt", "/var/tmp": "drwxrwxrwt", "/proc": "dr-xr-xr-x",
		"/etc/passwd": "-rw-r--r--", "/usr/bin/awk": "lrwxrwxrwx", "/mnt": "drwxr-xr-x",
		"/run": "drwxr-xr-x", "/dev": "drwxr-xr-x", "/sys": "dr-xr-xr-x", "/etc/resolv.conf": "-rw-r--r--",
	} {
		if got := strings.Fields(modes[p] + " "); len(got) == 0 || got[0] != want {
			t.Errorf("%s: mode %q; want %s", p, modes[p], want)
		}
	}
}
