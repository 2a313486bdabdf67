package vmrecord

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/paths"
	"isopod/internal/vmnet"
)

// newRecords returns the records of a fresh state root.
func newRecords(t *testing.T) Records {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	return Records{Paths: p}
}

// TestDirListPrune: directories made for runs are listed newest first,
// with their exit; a finished one past keep-last is pruned after its
// leftovers are cleaned, and one whose owner lives stays.
func TestDirListPrune(t *testing.T) {
	rs := newRecords(t)
	var ids []string
	for i := range 3 {
		d, err := NewDir(rs.Paths, []string{"true"}, "base-min", "base")
		if err != nil {
			t.Fatal(err)
		}
		if d.Rec.Name == "" || !ValidID(d.Rec.ID) {
			t.Errorf("record %+v: want a name and a valid id", d.Rec)
		}
		d.Rec.Created = time.Now().Add(time.Duration(i) * time.Second)
		if i < 2 {
			code := i
			d.End(&code)
		} else {
			d.Save()
		}
		ids = append(ids, d.Rec.ID)
	}
	l, err := rs.VMList(context.Background())
	if err != nil || len(l.VMs) != 3 || l.VMs[0].ID != ids[2] || l.VMs[2].ID != ids[0] {
		t.Fatalf("list %+v, %v; want the three, newest first", l, err)
	}
	if l.VMs[1].ExitCode == nil || *l.VMs[1].ExitCode != 1 || l.VMs[0].Live {
		t.Errorf("entry %+v, %+v: want exit 1, and nothing live", l.VMs[1], l.VMs[0])
	}
	if !rs.Busy(ids[2]) || rs.Busy(ids[0]) {
		t.Errorf("busy: the unfinished run of this process %v, a finished one %v", rs.Busy(ids[2]), rs.Busy(ids[0]))
	}
	scratch := filepath.Join(rs.Paths.VM(ids[0]), "scratch.ext4")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var cleaned []string
	pr := rs.Prune(rs.List(), 2, time.Now(), slog.New(slog.DiscardHandler), func(r *Record) {
		cleaned = append(cleaned, r.ID)
		rs.CleanLeftovers(r)
	})
	if len(pr.Removed) != 1 || pr.Removed[0] != ids[0] || pr.Kept != 2 {
		t.Errorf("pruned %+v; want only %s removed", pr, ids[0])
	}
	if len(cleaned) != 2 {
		t.Errorf("cleaned %v; want the two finished runs", cleaned)
	}
	if _, err := os.Stat(rs.Paths.VM(ids[0])); !os.IsNotExist(err) {
		t.Errorf("the pruned directory is left: %v", err)
	}
	if got := KillOrphans(rs.List(), slog.New(slog.DiscardHandler)); len(got) != 0 {
		t.Errorf("killed %v; no VMM ran", got)
	}
}

// TestSweepSocketDirs: an old socket directory of no run is removed, a
// fresh one stays.
func TestSweepSocketDirs(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	rs := newRecords(t)
	base, err := vmnet.SocketBase(rs.Paths.Scope())
	if err != nil {
		t.Fatal(err)
	}
	stale, fresh := filepath.Join(base, "vm-0000aaaa"), filepath.Join(base, "vm-0000bbbb")
	for _, d := range []string{stale, fresh} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	rs.SweepSocketDirs()
	if _, err := os.Stat(stale); err == nil {
		t.Error("a stale socket directory was kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh socket directory was removed: %v", err)
	}
}

// TestPausedIsKept: a paused session's VM is busy, so gc neither cleans
// nor prunes it, whoever owned it.
func TestPausedIsKept(t *testing.T) {
	rs := newRecords(t)
	d, err := NewDir(rs.Paths, []string{"(session)"}, "base-min", "")
	if err != nil {
		t.Fatal(err)
	}
	d.Rec.Created = time.Now().Add(-time.Hour)
	d.Rec.OwnerPID, d.Rec.OwnerStartTime = 1, 1 // gone
	d.Pause()
	scratch := filepath.Join(rs.Paths.VM(d.Rec.ID), "scratch.ext4")
	if err := os.WriteFile(scratch, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	pr := rs.Prune(rs.List(), 0, time.Now(), slog.New(slog.DiscardHandler), rs.CleanLeftovers)
	if len(pr.Removed) != 0 || !rs.Busy(d.Rec.ID) {
		t.Errorf("pruned %+v, busy %v; want the paused VM kept", pr, rs.Busy(d.Rec.ID))
	}
	if _, err := os.Stat(scratch); err != nil {
		t.Errorf("the paused VM's scratch disk: %v", err)
	}
	if _, err := Reopen(d.Path()); err != nil {
		t.Fatal(err)
	}
	if r, _ := Read(d.Path()); r.Paused || r.OwnerPID != os.Getpid() {
		t.Errorf("reopened record %+v; want this process's, not paused", r)
	}
}
