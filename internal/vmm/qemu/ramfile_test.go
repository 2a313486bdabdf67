package qemu

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// A boot with a RAM file makes it anew, sparse, of the guest's size, and
// maps it shared as a boot's memfd.
func TestRAMFileAtBoot(t *testing.T) {
	cfg := baseConfig()
	cfg.RAMFile = filepath.Join(t.TempDir(), "ram")
	os.WriteFile(cfg.RAMFile, []byte("a stale file"), 0o600)
	l := launch{}
	mf := &machineFiles{}
	if err := (&Driver{}).openRAM(&cfg, &l, mf, ""); err != nil {
		t.Fatal(err)
	}
	defer mf.closeAll()
	st, err := os.Stat(cfg.RAMFile)
	mst, _ := mf.mem.Stat()
	if err != nil || st.Size() != int64(cfg.MemMiB)<<20 || !os.SameFile(st, mst) || !mf.ramFile {
		t.Fatalf("the RAM file: %v, %v; want a new one of the guest's size, mapped", st, err)
	}
	if blocks := st.Sys().(*syscall.Stat_t).Blocks; blocks != 0 {
		t.Errorf("the new RAM file occupies %d blocks; want none", blocks)
	}
	argv := strings.Join(buildArgs(&cfg, l), " ")
	if !strings.Contains(argv, "mem-path=/proc/self/fd/") || !strings.Contains(argv, ",share=on") {
		t.Errorf("argv %s; want the file's descriptor, shared", argv)
	}
}

// A restore with RAMCopy fills a RAM file of its own from the snapshot's
// (a reflink or a sparse copy: either passes), and the snapshot's file
// is never the machine's.
func TestRAMFileCopiedFromASharedSnapshot(t *testing.T) {
	dir := t.TempDir()
	cfg := baseConfig()
	size := int64(cfg.MemMiB) << 20
	snap := filepath.Join(dir, snapMemory)
	f, err := os.Create(snap)
	if err != nil {
		t.Fatal(err)
	}
	f.Truncate(size)
	f.WriteAt([]byte("guest page"), 1<<20)
	f.Close()
	cfg.OwnRAM, cfg.RAMCopy, cfg.RAMFile = true, true, filepath.Join(dir, "ram")
	l := launch{restored: true, romOff: true}
	mf := &machineFiles{}
	if err := (&Driver{}).openRAM(&cfg, &l, mf, snap); err != nil {
		t.Fatal(err)
	}
	defer mf.closeAll()
	if err := mf.waitRAM(); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(snap)
	rst, _ := os.Stat(cfg.RAMFile)
	mst, _ := mf.mem.Stat()
	if os.SameFile(st, rst) || !os.SameFile(rst, mst) || !mf.ramFile {
		t.Fatalf("the RAM file is the snapshot's %v, mapped %v; want a file of its own, mapped", os.SameFile(st, rst), os.SameFile(rst, mst))
	}
	got := make([]byte, 10)
	if _, err := mf.mem.ReadAt(got, 1<<20); err != nil || string(got) != "guest page" || rst.Size() != size {
		t.Errorf("the RAM file holds %q (%v), %d bytes; want the snapshot's RAM", got, err, rst.Size())
	}
	if rst.Sys().(*syscall.Stat_t).Blocks*512 > 1<<20 {
		t.Errorf("the RAM file occupies %d blocks: its holes were filled", rst.Sys().(*syscall.Stat_t).Blocks)
	}
	mf.mem.WriteAt([]byte("guest wrote"), 1<<20)
	b, _ := os.ReadFile(snap)
	if !bytes.Equal(b[1<<20:1<<20+10], []byte("guest page")) {
		t.Error("a write to the RAM file changed the snapshot's")
	}
	argv := strings.Join(buildArgs(&cfg, l), " ")
	if !strings.Contains(argv, ",share=on") || strings.Contains(argv, "rom=off") {
		t.Errorf("argv %s; want the file's descriptor, shared, writable", argv)
	}
}
