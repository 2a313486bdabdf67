package e2e

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/knobs"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// fakeSource writes a state root as install.sh and some runs leave it, with
// the temporary entries of a build at work.
func fakeSource(t *testing.T) string {
	t.Helper()
	src := filepath.Join(t.TempDir(), "src")
	files := map[string]string{
		"kernels/6.1.0-1/vmlinuz":                      "kernel",
		"kernels/6.1.0-1/kernel.json":                  `{"version":"6.1.0-1"}`,
		"kernels/6.1.0-1/modules/virtio_blk.ko":        "module",
		"kernels/.download-6.1.0-2/vmlinuz":            "half a kernel",
		"images/base-min.sqfs":                         "squashfs",
		"images/base-min.json":                         `{"flavor":"base-min"}`,
		"images/initramfs.cpio":                        "cpio",
		"images/initramfs.json":                        `{}`,
		"images/scratch-1024.ext4":                     "ext4",
		"images/.tmp-base-debian-123":                  "half an image",
		"snapshots/wk-0123456789abcdef/memory":         "ram",
		"snapshots/wk-0123456789abcdef/state":          "devices",
		"snapshots/wk-0123456789abcdef/warm.json":      `{"key":"wk-0123456789abcdef"}`,
		"snapshots/wk-0123456789abcdef/uses":           "\x01\x01",
		"snapshots/.tmp-wk-fedcba9876543210-01/memory": "half a snapshot",
		"vms/vm-11111111/record.json":                  `{"id":"vm-11111111"}`,
		"stages/st-1/meta.json":                        `{}`,
		"locks/base-min.lock":                          "",
		"accel-probe.json":                             `{"kvm":false}`,
	}
	for name, body := range files {
		p := filepath.Join(src, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("6.1.0-1", filepath.Join(src, "kernels", "current")); err != nil {
		t.Fatal(err)
	}
	// Old enough that a rewrite within the test would show in the time.
	old := time.Now().Add(-time.Hour)
	filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			os.Chtimes(p, old, old)
		}
		return nil
	})
	return src
}

// treeState records every entry under root: its type, mode, size, time and
// content, and the file it is (so that a replaced file shows too).
func treeState(t *testing.T, root string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		v := fi.Mode().String()
		if fi.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + fi.ModTime().String() + " " + string(b)
		}
		out[strings.TrimPrefix(p, root)] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func sameTree(t *testing.T, before, after map[string]string) {
	t.Helper()
	for k, v := range before {
		if got, ok := after[k]; !ok {
			t.Errorf("source %s: removed", k)
		} else if got != v {
			t.Errorf("source %s: got %q; want %q", k, got, v)
		}
	}
	for k := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("source %s: added", k)
		}
	}
}

func TestHomeLinksSharedState(t *testing.T) {
	src := fakeSource(t)
	h, err := NewHome(t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })

	for _, name := range []string{
		"kernels/6.1.0-1/vmlinuz", "kernels/6.1.0-1/modules/virtio_blk.ko",
		"images/base-min.sqfs", "images/base-min.json", "images/initramfs.cpio", "images/scratch-1024.ext4",
		"snapshots/wk-0123456789abcdef/memory", "snapshots/wk-0123456789abcdef/warm.json", "accel-probe.json",
	} {
		priv, err := os.Lstat(filepath.Join(h.Dir, name))
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		orig, _ := os.Lstat(filepath.Join(src, name))
		if !os.SameFile(priv, orig) {
			t.Errorf("%s: got a file of its own; want a hard link to the source's", name)
		}
	}
	for _, dir := range []string{"kernels", "kernels/6.1.0-1", "images", "snapshots", "snapshots/wk-0123456789abcdef"} {
		if fi, err := os.Lstat(filepath.Join(h.Dir, dir)); err != nil || !fi.IsDir() {
			t.Errorf("%s: got %v, %v; want a directory of the home's own", dir, fi, err)
		}
	}
	if got, err := os.Readlink(filepath.Join(h.Dir, "kernels", "current")); err != nil || got != "6.1.0-1" {
		t.Errorf("kernels/current: got %q, %v; want the source's link copied", got, err)
	}
	for _, name := range []string{
		"kernels/.download-6.1.0-2", "images/.tmp-base-debian-123", "snapshots/.tmp-wk-fedcba9876543210-01",
		"vms", "stages", "locks",
	} {
		if _, err := os.Lstat(filepath.Join(h.Dir, name)); err == nil {
			t.Errorf("%s: present in the private home; want it left out", name)
		}
	}
}

// TestHomeLeavesSourceAlone does to a private home what runs and builds do
// to a state root and checks that the source is as it was and the home is
// gone.
func TestHomeLeavesSourceAlone(t *testing.T) {
	src := fakeSource(t)
	before := treeState(t, src)
	h, err := NewHome(t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	dir := h.Dir
	at := func(name string) string { return filepath.Join(dir, name) }
	publish := func(name, body string) {
		t.Helper()
		tmp := at(filepath.Join(filepath.Dir(name), ".tmp-publish"))
		if err := os.WriteFile(tmp, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, at(name)); err != nil {
			t.Fatal(err)
		}
	}
	// An image rebuild and a new sidecar, published by rename.
	publish("images/base-min.sqfs", "rebuilt")
	publish("images/base-min.json", `{"flavor":"base-min","rebuilt":true}`)
	// A kernel fetch replacing the kernel's directory.
	if err := os.MkdirAll(at("kernels/.tmp-k/modules"), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(at("kernels/.tmp-k/vmlinuz"), []byte("new kernel"), 0o644)
	os.Rename(at("kernels/6.1.0-1"), at("kernels/.tmp-k.old"))
	if err := os.Rename(at("kernels/.tmp-k"), at("kernels/6.1.0-1")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(at("kernels/.tmp-k.old"))
	// A resume from the snapshot appends to its use count.
	uses, err := os.OpenFile(at("snapshots/wk-0123456789abcdef/uses"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	uses.Write([]byte{1})
	uses.Close()
	// A retired snapshot and a swept initramfs.
	if err := os.Rename(at("snapshots/wk-0123456789abcdef"), at("snapshots/.old-wk")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(at("snapshots/.old-wk")); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(at("images/initramfs.cpio")); err != nil {
		t.Fatal(err)
	}
	// Records, stages and locks of the home's own.
	for _, d := range []string{"vms/vm-22222222", "stages/st-2", "locks"} {
		if err := os.MkdirAll(at(d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	os.WriteFile(at("vms/vm-22222222/record.json"), []byte("{}"), 0o600)
	os.WriteFile(at("locks/base-min.lock"), nil, 0o600)

	if err := h.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Errorf("private home %s left behind", dir)
	}
	sameTree(t, before, treeState(t, src))
}

// TestHomeReportsWriteThrough writes into a linked file, which isopod never
// does, and checks that Close says so and still removes the home.
func TestHomeReportsWriteThrough(t *testing.T) {
	src := fakeSource(t)
	h, err := NewHome(t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	dir := h.Dir
	f, err := os.OpenFile(filepath.Join(dir, "images", "base-min.sqfs"), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("appended")
	f.Close()
	err = h.Close()
	if err == nil || !strings.Contains(err.Error(), filepath.Join(src, "images", "base-min.sqfs")) {
		t.Errorf("Close after a write through a link: got %v; want an error naming the source file", err)
	}
	if _, err := os.Lstat(dir); err == nil {
		t.Errorf("private home %s left behind", dir)
	}
}

func TestHomeWithoutSource(t *testing.T) {
	h, err := NewHome(t.TempDir(), filepath.Join(t.TempDir(), "none"))
	if err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(h.Dir)
	if len(ents) != 1 || ents[0].Name() != ownerFile {
		t.Errorf("home of a missing source holds %v; want only its owner file", ents)
	}
	if err := h.Close(); err != nil {
		t.Error(err)
	}
}

// TestSweepHomes removes the home of a test binary that died before Close
// and keeps the home of one still running.
func TestSweepHomes(t *testing.T) {
	tmp := t.TempDir()
	src := fakeSource(t)
	before := treeState(t, src)
	live, err := NewHome(tmp, src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { live.Close() })
	dead, err := NewHome(tmp, src)
	if err != nil {
		t.Fatal(err)
	}
	dead.owner.Close() // as when its process is killed
	young, err := NewHome(tmp, src)
	if err != nil {
		t.Fatal(err)
	}
	young.owner.Close()
	old := time.Now().Add(-2 * sweepAge)
	for _, d := range []string{live.Dir, dead.Dir} {
		if err := os.Chtimes(d, old, old); err != nil {
			t.Fatal(err)
		}
	}
	SweepHomes(tmp)
	if _, err := os.Lstat(dead.Dir); err == nil {
		t.Error("the dead test binary's home was kept")
	}
	if _, err := os.Lstat(live.Dir); err != nil {
		t.Errorf("the live test binary's home: %v", err)
	}
	if _, err := os.Lstat(young.Dir); err != nil {
		t.Errorf("a home made under a minute ago: %v (it may not hold its lock yet)", err)
	}
	os.RemoveAll(young.Dir)
	sameTree(t, before, treeState(t, src))
}

// TestPrivateHomeKeepsRunsOut boots a VM through the CLI and checks that its
// record is in the private home, not in the user's.
func TestPrivateHomeKeepsRunsOut(t *testing.T) {
	RequireVM(t)
	if got := os.Getenv(knobs.Home); got != HomeDir || HomeDir == SourceHome {
		t.Fatalf("%s=%q; want the private home %q, not %q", knobs.Home, got, HomeDir, SourceHome)
	}
	r := Run(t, "--no-network", "--", "true")
	id := Str(r.JSON, "vm_id")
	if _, err := os.Stat(filepath.Join(HomeDir, "vms", id, "record.json")); err != nil {
		t.Errorf("the run's record in the private home: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(SourceHome, "vms", id)); err == nil {
		t.Errorf("the run wrote its record %s into the user's state root %s", id, SourceHome)
	}
}
