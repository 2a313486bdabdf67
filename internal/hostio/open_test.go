package hostio

import (
	"bytes"
	"isopod/internal/hostio/hostiotest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/settings"
)

func TestOpenCopyOut(t *testing.T) {
	h := newHostTree(t)
	p := h.policy()
	path, dir, err := p.OpenCopyOut("new/dir/x.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer dir.Close()
	if want := filepath.Join(h.Root, "new", "dir", "x.txt"); path != want {
		t.Errorf("path %q, want %q", path, want)
	}
	var got, want syscall.Stat_t
	if err := syscall.Fstat(int(dir.Fd()), &got); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Stat(filepath.Join(h.Root, "new", "dir"), &want); err != nil {
		t.Fatalf("the missing parents were not created: %v", err)
	}
	if got.Ino != want.Ino || got.Dev != want.Dev {
		t.Error("the directory returned is not the destination's parent")
	}
	// Refusals create nothing, even past the first missing directory.
	before := hostiotest.Snapshot(t, h.Base)
	for _, arg := range []string{"other/new/../x", "in-dangling/a/b", ".isopod/new/x", "outdir-link/new/x"} {
		if _, dir, err := p.OpenCopyOut(arg); err == nil {
			dir.Close()
			t.Errorf("OpenCopyOut(%q) accepted", arg)
		}
	}
	hostiotest.SameSnapshot(t, before, hostiotest.Snapshot(t, h.Base))
}

func TestHostIOAliasAndUnconfinedRoot(t *testing.T) {
	h := newHostTree(t)
	via := filepath.Join(h.Base, "root-link")
	if err := os.Symlink(h.Root, via); err != nil {
		t.Fatal(err)
	}
	p, _ := Local(settings.HostIO{Root: via, RootSet: true, StdinFile: true, CopyOut: true}, h.Root, h.Home)
	if data, _, err := p.ReadStdinFile(filepath.Join(via, "ok.txt")); err != nil || !bytes.HasPrefix(data, []byte("hello")) {
		t.Errorf("an absolute path under the root as configured: %q, %v", data, err)
	}
	un := Policy{Root: "/", Home: h.Home, StdinFile: true}
	if _, _, err := un.ReadStdinFile("/../.." + h.Secret); err != nil {
		t.Errorf("unconfined: %v", err)
	}
}

func TestRemote(t *testing.T) {
	h := newHostTree(t)
	on := settings.HostIO{StdinFile: true, CopyOut: true, Workspace: true}
	off, _ := Remote(on, "", h.Home)
	if _, _, err := off.ReadStdinFile("ok.txt"); err == nil || !strings.Contains(err.Error(), "--host-io-root") {
		t.Errorf("stdin_file without --host-io-root: %v", err)
	}
	if _, err := off.ResolveCopyOut("x"); err == nil || !strings.Contains(err.Error(), "read_files") {
		t.Errorf("copy_out without --host-io-root: %v", err)
	}
	if !strings.Contains(off.String(), "off") {
		t.Errorf("policy line %q does not say off", off.String())
	}
	rooted, _ := Remote(on, h.Root, h.Home)
	if _, _, err := rooted.ReadStdinFile("ok.txt"); err != nil {
		t.Errorf("stdin_file under --host-io-root: %v", err)
	}
	if _, _, err := rooted.ReadStdinFile("../outside/secret.txt"); err == nil || !strings.Contains(err.Error(), "--host-io-root") {
		t.Errorf("an escape is not refused naming --host-io-root: %v", err)
	}
}
