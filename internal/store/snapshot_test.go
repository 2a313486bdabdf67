package store

import (
	"bytes"
	"context"
	"os"
	"testing"
)

// A snapshot holds the disk's bytes, sparse, in the store's staging area;
// its commit is the same stage as the disk's own, and Close leaves
// nothing behind.
func TestSnapshotLayer(t *testing.T) {
	s := newStore(t)
	src := smallLayer(t, 7)
	sn, err := s.SnapshotLayer(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile(src)
	got, err := os.ReadFile(sn.Path)
	if err != nil || !bytes.Equal(got, want) {
		t.Fatalf("the snapshot's bytes differ from the disk's (%v)", err)
	}
	if use := diskUse(t, sn.Path); use > 1<<20 {
		t.Errorf("the snapshot allocates %d bytes; the disk's data is 14 KB", use)
	}
	m, _, err := s.CommitSnapshot(context.Background(), sn, req(sn.Path, "snap", ""))
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := hashLayer(context.Background(), src, "", testFlavor)
	if err != nil || m.ID != id {
		t.Errorf("the snapshot's stage is %s; the disk's content id is %s (%v)", m.ID, id, err)
	}
	// The snapshot moved into the stage: its bytes, read-only.
	if got, err := os.ReadFile(s.LayerPath(m.ID)); err != nil || !bytes.Equal(got, want) {
		t.Errorf("the stage's layer differs from the disk (%v)", err)
	}
	if fi, err := os.Stat(s.LayerPath(m.ID)); err != nil || fi.Mode().Perm() != 0o444 {
		t.Errorf("the stage's layer: %v, %v; want read-only", fi, err)
	}
	if _, err := os.Stat(sn.Path); err == nil {
		t.Error("the snapshot is still there after its commit")
	}
	// GC keeps a snapshot that is in use.
	sn2, err := s.SnapshotLayer(context.Background(), src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GC(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(sn2.Path); err != nil {
		t.Errorf("GC removed a snapshot in use: %v", err)
	}
	sn.Close()
	sn2.Close()
	noTemps(t, s)
	if _, err := s.SnapshotLayer(context.Background(), src+".gone"); err == nil {
		t.Error("a snapshot of a missing disk succeeded")
	}
	noTemps(t, s)
}
