package qemu

import (
	"bytes"
	"isopod/internal/jail"
	"isopod/internal/vmm"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSealedCopy: a sealed copy holds the file's data at the same offsets
// with its holes and size, and nobody can write, grow or shrink it.
func TestSealedCopy(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ram")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	const size = 8 << 20
	chunks := map[int64][]byte{0: bytes.Repeat([]byte("a"), 5000), 3 << 20: bytes.Repeat([]byte("b"), 70000), size - 4096: bytes.Repeat([]byte("c"), 4096)}
	for off, b := range chunks {
		if _, err := f.WriteAt(b, off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	c, err := (&sealedCache{}).get(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make([]byte, size)
	if _, err := c.ReadAt(got, 0); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(path)
	if !bytes.Equal(got, want) {
		t.Error("the copy's data differ from the file's")
	}
	if data, err := unix.Seek(int(c.Fd()), 1<<20, unix.SEEK_DATA); err != nil || data != 3<<20 {
		t.Errorf("the hole after the first chunk: next data at %d (%v); want %d", data, err, 3<<20)
	}
	if _, err := c.WriteAt([]byte("x"), 0); err == nil {
		t.Error("a sealed copy can be written")
	}
	if err := c.Truncate(size * 2); err == nil {
		t.Error("a sealed copy can grow")
	}
	rw, err := os.OpenFile("/proc/self/fd/"+itoa(int(c.Fd())), os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("reopening the copy read-write, as QEMU does: %v", err)
	}
	defer rw.Close()
	if _, err := rw.WriteAt([]byte("x"), 0); err == nil {
		t.Error("a reopened sealed copy can be written")
	}
}

func itoa(n int) string { return fdPath(n)[len("/proc/self/fd/"):] }

// TestReadOnlyFor: a jailed QEMU gets a boot file itself only where its
// uid may read it and may not write it.
func TestReadOnlyFor(t *testing.T) {
	dir := t.TempDir()
	me := os.Getuid()
	for _, tt := range []struct {
		name string
		mode os.FileMode
		uid  int // the VMM's
		want bool
	}{
		{"0644, another's", 0o644, me + 1, true},
		{"0444, another's", 0o444, me + 1, true},
		{"0644, the VMM's own", 0o644, me, false},
		{"0600", 0o600, me + 1, false},
		{"0640", 0o640, me + 1, false},
		{"0664: its group writes", 0o664, me + 1, false},
		{"0646: others write", 0o646, me + 1, false},
	} {
		p := filepath.Join(dir, "f")
		os.Remove(p)
		if err := os.WriteFile(p, []byte("kernel"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, tt.mode); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		if got := readOnlyFor(f, tt.uid); got != tt.want {
			t.Errorf("%s: %v; want %v", tt.name, got, tt.want)
		}
		f.Close()
	}
	d, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if readOnlyFor(d, me+1) {
		t.Error("a directory counts as a boot file")
	}
}

// TestFileIDNamesTheInode: a file replaced by one of the same size and
// time is another file to the sealed cache.
func TestFileIDNamesTheInode(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a"), filepath.Join(dir, "b")
	os.WriteFile(a, []byte("same"), 0o644)
	os.WriteFile(b, []byte("same"), 0o644)
	sa, _ := os.Stat(a)
	os.Chtimes(b, sa.ModTime(), sa.ModTime())
	sb, _ := os.Stat(b)
	if fileID(sa) == fileID(sb) {
		t.Errorf("two files, one identity %s", fileID(sa))
	}
}

// TestJailedRAM: a jailed restore maps the snapshot's RAM file itself only
// where QEMU can map a read-only file as private RAM (rom=off) and the
// file's mode keeps the VMM from writing it; otherwise a sealed copy, and
// the command line keeps QEMU 7.2's options.
func TestJailedRAM(t *testing.T) {
	j, err := jail.New(jail.Config{})
	if err != nil {
		t.Skipf("no jail on this host: %v", err)
	}
	d := &Driver{jail: j}
	if os.Geteuid() == j.UID() {
		t.Skip("the test runs as the VMM's uid")
	}
	dir := t.TempDir()
	tests := []struct {
		name       string
		mode       os.FileMode
		romOff     bool
		wantItself bool
	}{
		{"rom=off and a file the VMM can only read", 0o644, true, true},
		{"rom=off but a file the VMM cannot read", 0o600, true, false},
		{"no rom=off (QEMU before 8.2)", 0o644, false, false},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strconv.Itoa(i))
			if err := os.WriteFile(path, bytes.Repeat([]byte{7}, 8192), tt.mode); err != nil {
				t.Fatal(err)
			}
			os.Chmod(path, tt.mode)
			l := launch{romOff: tt.romOff, restored: true}
			f, ready, err := d.jailedRAM(path, &l)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if (ready == nil) != tt.wantItself {
				t.Errorf("a wait for the copy: %v; want %v", ready != nil, !tt.wantItself)
			}
			if ready != nil {
				if err := ready(); err != nil {
					t.Fatal(err)
				}
			}
			got, _ := f.Stat()
			want, _ := os.Stat(path)
			if itself := os.SameFile(got, want); itself != tt.wantItself || l.romOff != tt.wantItself {
				t.Errorf("the file itself: %v, rom=off: %v; want %v", itself, l.romOff, tt.wantItself)
			}
			mem := buildArgs(ptr(baseConfig()), l)
			if has := strings.Contains(strings.Join(mem, " "), ",readonly=on,rom=off"); has != tt.wantItself {
				t.Errorf("argv has readonly=on,rom=off: %v; want %v", has, tt.wantItself)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestOpenFilesFailsCleanly: a file that cannot be opened (the NIC's
// socket gone, a disk removed) is an error, and what was opened is closed.
func TestOpenFilesFailsCleanly(t *testing.T) {
	dir := t.TempDir()
	kernel := filepath.Join(dir, "kernel")
	if err := os.WriteFile(kernel, []byte("k"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range []vmm.Config{
		{Kernel: kernel, Disks: []vmm.Disk{{Path: filepath.Join(dir, "missing.ext4")}}},
		{Kernel: kernel, Net: &vmm.Net{Socket: filepath.Join(dir, "missing.sock")}},
	} {
		before := openFDs(t)
		mf, err := (&Driver{}).openFiles(&cfg, &launch{}, "")
		if err == nil || mf != nil {
			t.Fatalf("openFiles with a missing file: %v, %v; want an error", mf, err)
		}
		if after := openFDs(t); after != before {
			t.Errorf("%d descriptors open after a failed openFiles; want %d", after, before)
		}
	}
}

// openFDs counts this process's open descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// TestSealedCacheStart: a copy started in the background is, once ready,
// the file's bytes, sealed; a second start of the same file shares it, and
// a replaced file gets a new copy.
func TestSealedCacheStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ram")
	want := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := os.WriteFile(path, want, 0o600); err != nil {
		t.Fatal(err)
	}
	var c sealedCache
	open := func() (*os.File, os.FileInfo) {
		t.Helper()
		f, ready, err := c.start(path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if err := ready(); err != nil {
			t.Fatalf("ready: %v", err)
		}
		st, err := f.Stat()
		if err != nil {
			t.Fatal(err)
		}
		return f, st
	}
	f, st := open()
	got := make([]byte, len(want)+1)
	if n, _ := f.ReadAt(got, 0); !bytes.Equal(got[:n], want) {
		t.Errorf("the copy holds %d bytes that differ from the file's %d", n, len(want))
	}
	if seals, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_WRITE == 0 {
		t.Errorf("seals %#x (%v): the copy is not sealed against writing", seals, err)
	}
	if _, again := open(); !os.SameFile(st, again) {
		t.Error("a second start of the same file made another copy")
	}
	if err := os.WriteFile(path+".new", want[:4096], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	if _, other := open(); os.SameFile(st, other) || other.Size() != 4096 {
		t.Errorf("a replaced file: same copy %v, size %d; want a new copy of 4096 bytes", os.SameFile(st, other), other.Size())
	}
}

// TestRAMFile: a restore with a RAM file of its own maps that file,
// shared and writable, with no copy: the snapshot's RAM file becomes it
// (a hard link) where it is absent, and is it already on a later resume;
// a snapshot of another size is refused.
func TestRAMFile(t *testing.T) {
	dir := t.TempDir()
	cfg := baseConfig()
	size := int64(cfg.MemMiB) << 20
	snap := filepath.Join(dir, "paused", snapMemory)
	os.Mkdir(filepath.Dir(snap), 0o700)
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.WriteAt([]byte("guest page"), 1<<20)
	f.Close()
	cfg.OwnRAM, cfg.RAMFile = true, filepath.Join(dir, "ram")
	for _, when := range []string{"first resume", "later resume"} {
		l := launch{restored: true, romOff: true}
		mf := &machineFiles{}
		if err := (&Driver{}).ramFile(&cfg, &l, mf, snap); err != nil {
			t.Fatal(err)
		}
		st, _ := os.Stat(snap)
		rst, _ := os.Stat(cfg.RAMFile)
		mst, _ := mf.mem.Stat()
		if !os.SameFile(st, rst) || !os.SameFile(st, mst) || !mf.ramFile {
			t.Errorf("%s: the RAM file is the snapshot's %v, mapped %v; want the snapshot's file itself", when, os.SameFile(st, rst), os.SameFile(st, mst))
		}
		argv := strings.Join(buildArgs(&cfg, l), " ")
		if !strings.Contains(argv, "mem-path=/proc/self/fd/") || !strings.Contains(argv, ",share=on") || strings.Contains(argv, "rom=off") {
			t.Errorf("%s: argv %s; want the file's descriptor, shared, writable", when, argv)
		}
		mf.closeAll()
	}
	big := cfg
	big.MemMiB = cfg.MemMiB * 2
	if err := (&Driver{}).ramFile(&big, &launch{restored: true}, &machineFiles{}, snap); err == nil {
		t.Error("a snapshot of another size was taken as RAM")
	}
}
