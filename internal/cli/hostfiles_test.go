package cli

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/workspace"
)

// TestOpenHostFiles: the CLI opens its host files through the operator's
// policy (internal/hostio) before the core is called: each copy-out and
// the workspace patch get their directory opened (the core writes in it),
// the stdin file is opened for the core to read, and a destination that
// cannot be written is refused, with nothing left open.
func TestOpenHostFiles(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.txt")
	if err := os.WriteFile(in, []byte("input"), 0o644); err != nil {
		t.Fatal(err)
	}
	o := runOptions{stdinFile: in}
	o.req.CopyOut = []sandbox.CopyOut{{Guest: "/a", Host: filepath.Join(dir, "a.out")}}
	o.req.Workspace = &workspace.Request{Host: dir, Out: filepath.Join(dir, "ws.patch")}
	release, err := o.openHostFiles()
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []*os.File{o.req.CopyOut[0].HostDir, o.req.Workspace.OutDir} {
		if d == nil {
			t.Fatal("a destination's directory was not opened")
		}
		a, _ := d.Stat()
		b, _ := os.Stat(dir)
		if !os.SameFile(a, b) {
			t.Errorf("opened %s, not the destination's directory %s", d.Name(), dir)
		}
	}
	if o.req.Stdin == nil {
		t.Fatal("the stdin file was not opened for the core")
	}
	if b, err := io.ReadAll(o.req.Stdin); err != nil || string(b) != "input" {
		t.Errorf("stdin read %q, %v", b, err)
	}
	release()
	if _, err := o.req.CopyOut[0].HostDir.Stat(); err == nil {
		t.Error("release left the directory open")
	}

	link := filepath.Join(dir, "link")
	if err := os.Symlink(in, link); err != nil {
		t.Fatal(err)
	}
	bad := runOptions{}
	bad.req.CopyOut = []sandbox.CopyOut{{Guest: "/a", Host: filepath.Join(dir, "b.out")}, {Guest: "/b", Host: link}}
	if _, err := bad.openHostFiles(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Fatalf("a copy-out onto a symlink: %v; want invalid_argument", err)
	}
	if d := bad.req.CopyOut[0].HostDir; d == nil {
		t.Fatal("the first destination was not opened")
	} else if _, err := d.Stat(); err == nil {
		t.Error("a refusal left the first destination's directory open")
	}
}
