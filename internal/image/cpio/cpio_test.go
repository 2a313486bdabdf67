package cpio

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
)

type readEntry struct {
	ino, mode, nlink, mtime, uid, gid uint32
	name                              string
	data                              []byte
}

// readAll parses a newc stream, checking alignment and the trailer.
func readAll(t *testing.T, b []byte) []readEntry {
	t.Helper()
	var out []readEntry
	off := 0
	field := func(i int) uint32 {
		v, err := strconv.ParseUint(string(b[off+6+8*i:off+14+8*i]), 16, 32)
		if err != nil {
			t.Fatalf("field %d at %d: %v", i, off, err)
		}
		return uint32(v)
	}
	for {
		if off%4 != 0 {
			t.Fatalf("header at %d not 4-aligned", off)
		}
		if string(b[off:off+6]) != "070701" {
			t.Fatalf("bad magic at %d: %q", off, b[off:off+6])
		}
		e := readEntry{ino: field(0), mode: field(1), uid: field(2), gid: field(3), nlink: field(4), mtime: field(5)}
		size := int(field(6))
		nsize := int(field(11))
		nameOff := off + 110
		e.name = string(b[nameOff : nameOff+nsize-1])
		if b[nameOff+nsize-1] != 0 {
			t.Fatalf("%s: name not NUL-terminated", e.name)
		}
		dataOff := (nameOff + nsize + 3) &^ 3
		e.data = b[dataOff : dataOff+size]
		off = (dataOff + size + 3) &^ 3
		if e.name == "TRAILER!!!" {
			if off != len(b) {
				t.Fatalf("trailer ends at %d of %d", off, len(b))
			}
			return out
		}
		out = append(out, e)
	}
}

func sample(t *testing.T) *Builder {
	t.Helper()
	b := NewBuilder()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(b.AddFile("/init", 0o755, []byte("#!/bin/sh\necho hi\n")))
	must(b.AddFile("lib/modules/x/kernel/a-b.ko", 0o644, []byte("ab")))
	must(b.AddFile("lib/modules/x/kernel/a/c.ko", 0o644, []byte("c")))
	must(b.AddDir("tmp", 0o1777))
	must(b.AddDir("dev", 0o755))
	must(b.AddCharDev("dev/console", 0o600, 5, 1))
	must(b.AddSymlink("bin/sh", "/init"))
	must(b.AddFile("etc/empty", 0o644, nil))
	return b
}

func TestBuilderOrderAndFields(t *testing.T) {
	var buf bytes.Buffer
	if _, err := sample(t).WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, buf.Bytes())
	wantNames := []string{
		"bin", "bin/sh", "dev", "dev/console", "etc", "etc/empty", "init",
		"lib", "lib/modules", "lib/modules/x", "lib/modules/x/kernel",
		"lib/modules/x/kernel/a", "lib/modules/x/kernel/a/c.ko", "lib/modules/x/kernel/a-b.ko", "tmp",
	}
	if len(got) != len(wantNames) {
		t.Fatalf("got %d entries; want %d", len(got), len(wantNames))
	}
	for i, e := range got {
		if e.name != wantNames[i] {
			t.Errorf("entry %d: %q; want %q", i, e.name, wantNames[i])
		}
		if e.ino != uint32(i+1) || e.mtime != 0 || e.uid != 0 || e.gid != 0 {
			t.Errorf("%s: ino %d mtime %d uid %d gid %d", e.name, e.ino, e.mtime, e.uid, e.gid)
		}
	}
	modes := map[string]uint32{"init": TypeRegular | 0o755, "tmp": TypeDir | 0o1777, "bin/sh": TypeSymlink | 0o777, "dev/console": TypeChar | 0o600, "lib": TypeDir | 0o755}
	for _, e := range got {
		if m, ok := modes[e.name]; ok && e.mode != m {
			t.Errorf("%s: mode %o; want %o", e.name, e.mode, m)
		}
		if e.name == "bin/sh" && string(e.data) != "/init" {
			t.Errorf("symlink target %q", e.data)
		}
	}
}

func TestDeterministic(t *testing.T) {
	var a, b bytes.Buffer
	if _, err := sample(t).WriteTo(&a); err != nil {
		t.Fatal(err)
	}
	if _, err := sample(t).WriteTo(&b); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Fatal("two builds of the same entries differ")
	}
}

func TestErrors(t *testing.T) {
	b := NewBuilder()
	if err := b.AddFile("a", 0o644, nil); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"duplicate":      b.AddFile("a", 0o644, nil),
		"file as parent": b.AddFile("a/b", 0o644, nil),
		"root":           b.AddDir("/", 0o755),
		"empty target":   b.AddSymlink("l", ""),
	} {
		if err == nil {
			t.Errorf("%s: no error", name)
		}
	}
	w := NewWriter(&bytes.Buffer{})
	if err := w.WriteHeader(&Header{Name: "f", Mode: TypeRegular | 0o644, Size: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte("toolong")); err == nil {
		t.Error("over-long write accepted")
	}
	if err := w.Close(); err == nil {
		t.Error("close with a short entry accepted")
	}
}

func TestExtractWithCpioTool(t *testing.T) {
	bin, err := exec.LookPath("cpio")
	if err != nil {
		t.Skip("cpio tool not installed")
	}
	var buf bytes.Buffer
	b := NewBuilder()
	b.AddFile("init", 0o755, []byte("agent"))
	b.AddFile("etc/isopod/modules", 0o644, []byte("/lib/a.ko\n"))
	b.AddSymlink("bin/sh", "../init")
	b.AddDir("tmp", 0o1777)
	if _, err := b.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(bin, "-id", "--quiet", "--no-absolute-filenames")
	cmd.Dir = dir
	cmd.Stdin = &buf
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("cpio -id: %v: %s", err, out)
	}
	if d, err := os.ReadFile(filepath.Join(dir, "etc/isopod/modules")); err != nil || string(d) != "/lib/a.ko\n" {
		t.Errorf("modules list: %q, %v", d, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "init")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("init: %v, %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || l != "../init" {
		t.Errorf("symlink: %q, %v", l, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "tmp")); err != nil || fi.Mode()&os.ModeSticky == 0 {
		t.Errorf("tmp: %v, %v", fi, err)
	}
}
