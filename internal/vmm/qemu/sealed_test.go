package qemu

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

// TestJailedRestoreWaitsForItsCopy: where a jailed restore takes the
// sealed copy of the snapshot's RAM (QEMU before 8.2), the copy is filled
// while QEMU starts and the guest runs only once it is complete: a copy
// held back a second still resumes a guest that answers, and the copy is
// sealed by then.
func TestJailedRestoreWaitsForItsCopy(t *testing.T) {
	d := newJailedDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	plan, err := d.machine(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if plan.ROMOff {
		t.Skip("this QEMU maps the snapshot's RAM file itself, with no copy")
	}
	g := vmmtest.BuildGuest(t)
	builder := vmmtest.Boot(t, d, vmmtest.Config(t, g))
	snap := t.TempDir()
	if err := builder.M.(vmm.Snapshotter).Snapshot(ctx, snap); err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	builder.M.Kill()
	builder.M.Wait()

	const hold = time.Second
	d.sealed.beforeFill = func() { time.Sleep(hold) }
	rc := vmmtest.Config(t, g)
	rc.ID += "held"
	serial := &vmmtest.SyncBuffer{}
	rc.SerialLog = serial
	began := time.Now()
	m, err := d.Restore(ctx, rc, snap)
	if err != nil {
		t.Fatalf("Restore: %v", err)
	}
	t.Cleanup(func() { m.Kill(); m.Wait(); m.Agent().Close() })
	if took := time.Since(began); took < hold {
		t.Errorf("Restore returned after %v, before its copy could be filled (%v)", took, hold)
	}
	d.sealed.mu.Lock()
	e := d.sealed.entries[filepath.Join(snap, snapMemory)]
	d.sealed.mu.Unlock()
	if e == nil {
		t.Fatal("the restore made no sealed copy of the snapshot's RAM")
	}
	if seals, err := unix.FcntlInt(e.f.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_WRITE == 0 {
		t.Errorf("seals %#x (%v): the guest runs on a copy not sealed against writing", seals, err)
	}
	hctx, hcancel := context.WithTimeout(ctx, 20*time.Second)
	defer hcancel()
	if _, err := agentclient.New(m.Agent(), nil).Hello(hctx); err != nil {
		t.Fatalf("the restored guest did not answer: %v; console:\n%s", err, serial.Tail(2000))
	}
}
