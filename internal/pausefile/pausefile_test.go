package pausefile

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

func TestIdentityChanged(t *testing.T) {
	was := Identity{VMM: "q1", Kernel: "k1", Initramfs: "i1", Agent: 3}
	tests := []struct {
		name string
		now  Identity
		want bool
	}{
		{"same", was, false},
		{"vmm", Identity{VMM: "q2", Kernel: "k1", Initramfs: "i1", Agent: 3}, true},
		{"kernel", Identity{VMM: "q1", Kernel: "k2", Initramfs: "i1", Agent: 3}, true},
		{"initramfs", Identity{VMM: "q1", Kernel: "k1", Initramfs: "i2", Agent: 3}, true},
		{"agent", Identity{VMM: "q1", Kernel: "k1", Initramfs: "i1", Agent: 4}, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := was.Changed(tc.now); (got != "") != tc.want {
				t.Errorf("Changed = %q, want a reason: %v", got, tc.want)
			}
		})
	}
}

func TestWriteRead(t *testing.T) {
	dir := t.TempDir()
	if _, err := Read(dir); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("Read of an empty directory: %v, want not_found", err)
	}
	p := &Paused{VMID: "vm-a", Dir: "/x/vm-a", Config: vmm.Config{MemMiB: 512}, Fork: true,
		Exec: ExecBase{Env: []string{"A=1"}, Cwd: "/w", LogDir: "/x/vm-a"}}
	if err := Write(dir, p); err != nil {
		t.Fatal(err)
	}
	got, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got.VMID != p.VMID || got.Config.MemMiB != 512 || !got.Fork || got.Exec.Cwd != "/w" {
		t.Errorf("Read = %+v, want %+v", got, p)
	}
	if err := got.Sync(dir); err != nil {
		t.Errorf("Sync: %v", err)
	}
}

// writeSparse writes a file of size bytes with data at the given offsets
// and holes elsewhere.
func writeSparse(t *testing.T, path string, size int64, at ...int64) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range at {
		if _, err := f.WriteAt(bytes.Repeat([]byte{0xab}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCopyFileKeepsContentAndHoles(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	writeSparse(t, src, 64<<20, 0, 32<<20)
	mt := time.Unix(1_700_000_000, 0)
	if err := os.Chtimes(src, mt, mt); err != nil {
		t.Fatal(err)
	}
	if err := copyFile(dst, src); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the copy's content differs")
	}
	if got := Allocated(dst); got > 1<<20 {
		t.Errorf("the copy occupies %d bytes: its holes were filled", got)
	}
	if st, _ := os.Stat(dst); !st.ModTime().Equal(mt) {
		t.Errorf("the copy's modification time is %v, want %v", st.ModTime(), mt)
	}
	if err := copyFile(dst, src); err == nil {
		t.Error("a copy over an existing file succeeded")
	}
}

func TestCopyFilesRewritesTheVMsOwnPaths(t *testing.T) {
	root := t.TempDir()
	vmDir := filepath.Join(root, "vms", "vm-a")
	work := filepath.Join(root, "work", "vm-a")
	for _, d := range []string{vmDir, work} {
		os.MkdirAll(d, 0o700)
	}
	scratch, upper, base := filepath.Join(vmDir, "scratch.ext4"), filepath.Join(work, "upper.ext4"), filepath.Join(root, "base.sqfs")
	for _, f := range []string{scratch, upper, base} {
		writeSparse(t, f, 1<<20, 0)
	}
	ram := filepath.Join(vmDir, "ram")
	writeSparse(t, ram, 1<<20, 0)
	p := &Paused{VMID: "vm-a", Dir: vmDir, Scratch: scratch, WorkspaceUpper: upper,
		Config: vmm.Config{Disks: []vmm.Disk{{Path: base, ReadOnly: true}, {Path: scratch}, {Path: upper}}, RAMFile: ram}}
	newDir := filepath.Join(root, "vms", "vm-b")
	os.MkdirAll(newDir, 0o700)
	c, err := p.CopyFiles("vm-b", newDir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{base, filepath.Join(newDir, "scratch.ext4"), filepath.Join(root, "work", "vm-b", "upper.ext4")}
	for i, d := range c.Config.Disks {
		if d.Path != want[i] {
			t.Errorf("disk %d: %s, want %s", i, d.Path, want[i])
		}
	}
	if c.Scratch != want[1] || c.WorkspaceUpper != want[2] || !c.Fork || c.VMID != "vm-b" || c.Exec.LogDir != newDir {
		t.Errorf("copy = %+v", c)
	}
	for _, f := range want[1:] {
		if _, err := os.Stat(f); err != nil {
			t.Errorf("not copied: %v", err)
		}
	}
	// The copy's RAM file is its own, named only: its resume takes its
	// snapshot's RAM as that file.
	if want := filepath.Join(newDir, "ram"); c.Config.RAMFile != want {
		t.Errorf("the copy's RAM file %s, want %s", c.Config.RAMFile, want)
	} else if _, err := os.Stat(want); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the VM's RAM file was copied: %v", err)
	}
	if p.Config.Disks[1].Path != scratch {
		t.Error("the copy changed the original's disks")
	}

	// A copy that fails removes what it copied.
	os.Remove(upper)
	other := filepath.Join(root, "vms", "vm-c")
	os.MkdirAll(other, 0o700)
	p.Config.Disks = p.Config.Disks[:2]
	if _, err := p.CopyFiles("vm-c", other); err == nil {
		t.Fatal("a copy of a missing file succeeded")
	}
	if _, err := os.Stat(filepath.Join(other, "scratch.ext4")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed copy left its files: %v", err)
	}
}

func TestCopySnapshotLeavesTheDescriptor(t *testing.T) {
	from, to := t.TempDir(), t.TempDir()
	writeSparse(t, filepath.Join(from, "ram"), 1<<20, 0)
	os.WriteFile(filepath.Join(from, "state"), []byte("s"), 0o600)
	Write(from, &Paused{VMID: "vm-a"})
	if err := CopySnapshot(to, from); err != nil {
		t.Fatal(err)
	}
	ents, _ := os.ReadDir(to)
	if len(ents) != 2 {
		t.Errorf("copied %d files, want the snapshot's 2", len(ents))
	}
	if _, err := Read(to); err == nil {
		t.Error("the descriptor was copied")
	}
}
