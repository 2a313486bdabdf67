package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/ledger"
)

// sharing returns an Admission of one place counted in the ledger in dir
// as holder key: two of them play two processes.
func sharing(t *testing.T, dir, key string) *admission.Admission {
	t.Helper()
	h := ledger.Self(key)
	h.Key = key
	l, err := ledger.Open(dir, h)
	if err != nil {
		t.Fatal(err)
	}
	return newAdmission(t, admission.Config{MaxVMs: 1, Queue: 1, MemoryBudgetMiB: 100000, OverheadMiB: 256,
		MinMemMiB: 128, RunMemMiB: 512, Ledger: l})
}

func TestSharedPlaces(t *testing.T) {
	dir := t.TempDir()
	cli, mcp := sharing(t, dir, "cli"), sharing(t, dir, "mcp")
	held, err := cli.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	waitAdmitted(t, held, "the first process's call")
	call, err := mcp.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	if s, _ := state(call); s != admission.TicketQueued {
		t.Fatal("a place another process holds was granted again")
	}
	if _, ok := mcp.TryHold(128, bg); ok {
		t.Error("a background VM took a place another process holds")
	}
	// Waiting past its own bound, the call gives up as busy.
	if err := call.WaitBounded(context.Background(), 300*time.Millisecond); !errors.Is(err, admission.ErrBusy) {
		t.Fatalf("a call waiting on another process's place: %v, want busy", err)
	}
	if st := mcp.Stats(); st.OtherPlaces != 1 || st.Queued != 0 {
		t.Errorf("stats %+v: want the other process's place and nobody waiting", st)
	}
	// Once the other process gives the place back, a waiting call gets it.
	call, err = mcp.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	held.Release()
	waitAdmitted(t, call, "the call after the other process's release")
	if again, _ := cli.Reserve(512); again == nil {
		t.Fatal("no ticket")
	} else {
		if s, _ := state(again); s != admission.TicketQueued {
			t.Error("the first process took the place back while the second holds it")
		}
		again.Release()
	}
	call.Release()
	if all, _ := ledger.Read(dir); len(all) != 0 {
		t.Errorf("entries once every place is back: %+v", all)
	}
}

// TestSharedYield: a background VM of one process gives way to a call
// waiting in another.
func TestSharedYield(t *testing.T) {
	dir := t.TempDir()
	mcp, cli := sharing(t, dir, "mcp"), sharing(t, dir, "cli")
	e := newEnder()
	ready, ok := mcp.TryHold(512, e.yield(true))
	if !ok {
		t.Fatal("no place for a ready VM on an idle host")
	}
	call, err := cli.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { done <- call.Wait(ctx) }()
	select {
	case <-e.asked:
	case <-time.After(10 * time.Second):
		t.Fatal("the ready VM was not asked to end for another process's call")
	}
	ready.Release()
	if err := <-done; err != nil {
		t.Fatalf("the call after the other process's ready VM ended: %v", err)
	}
	call.Release()
}

// TestWaitBoundedOwnVMs: a call waiting on this process's own VMs waits
// past its bound: only other processes' places make it give up.
func TestWaitBoundedOwnVMs(t *testing.T) {
	a := sharing(t, t.TempDir(), "mcp")
	first, _ := a.Reserve(512)
	second, err := a.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- second.WaitBounded(context.Background(), 100*time.Millisecond) }()
	select {
	case err := <-done:
		t.Fatalf("gave up on this process's own VM: %v", err)
	case <-time.After(600 * time.Millisecond):
	}
	first.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	second.Release()
}

// TestSharedWaitersFirst: while another process has a call waiting, no
// background VM takes a place here, free as it is.
func TestSharedWaitersFirst(t *testing.T) {
	dir := t.TempDir()
	a := newAdmission(t, admission.Config{MaxVMs: 4, Queue: 4, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512,
		Ledger: func() *ledger.Ledger {
			h := ledger.Self("mcp")
			h.Key = "mcp"
			l, _ := ledger.Open(dir, h)
			return l
		}()})
	h := ledger.Self("cli")
	h.Key = "cli"
	other, err := ledger.Open(dir, h)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := other.Begin()
	if err != nil {
		t.Fatal(err)
	}
	tx.Commit(nil, 1)
	if v, ok := a.TryHold(128, bg); ok {
		v.Release()
		t.Error("a background VM took a place while another process's call waits")
	}
	other.Clear()
	v, ok := a.TryHold(128, bg)
	if !ok {
		t.Fatal("no background place once nobody waits")
	}
	v.Release()
}
