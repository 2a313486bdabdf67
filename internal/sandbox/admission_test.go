package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
)

func newAdmission(t *testing.T, cfg sandbox.AdmissionConfig) *sandbox.Admission {
	t.Helper()
	a, err := sandbox.NewAdmission(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func state(t *sandbox.Ticket) (sandbox.TicketState, int) {
	s, pos, _ := t.Status()
	return s, pos
}

func TestAdmissionLimitsAndQueue(t *testing.T) {
	a := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 2, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256})
	var tickets []*sandbox.Ticket
	for i := range 4 {
		tk, err := a.Reserve(512)
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		tickets = append(tickets, tk)
	}
	if _, err := a.Reserve(512); !errors.Is(err, sandbox.ErrBusy) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a fifth reserve: %v, want busy (unavailable)", err)
	}
	for i, want := range []sandbox.TicketState{sandbox.TicketAdmitted, sandbox.TicketAdmitted, sandbox.TicketQueued, sandbox.TicketQueued} {
		if got, pos := state(tickets[i]); got != want || (want == sandbox.TicketQueued && pos != i-1) {
			t.Errorf("ticket %d: state %d position %d; want %d position %d", i, got, pos, want, i-1)
		}
	}
	if st := a.Stats(); st.Running != 2 || st.Queued != 2 || st.UsedMiB != 2*768 {
		t.Errorf("stats %+v", st)
	}
	// A queued call that gives up leaves the queue; the one behind moves up.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := tickets[2].Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with a cancelled context: %v", err)
	}
	if _, pos := state(tickets[3]); pos != 1 {
		t.Errorf("the last ticket is at %d after the one before left, want 1", pos)
	}
	done := make(chan error, 1)
	go func() { done <- tickets[3].Wait(context.Background()) }()
	tickets[0].Release()
	tickets[0].Release() // idempotent
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a released place did not admit the next in line")
	}
	tickets[1].Release()
	tickets[3].Release()
	if st := a.Stats(); st.Running != 0 || st.Queued != 0 || st.UsedMiB != 0 {
		t.Errorf("stats after every release %+v", st)
	}
}

func TestAdmissionMemoryBudget(t *testing.T) {
	a := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 10, Queue: 5, MemoryBudgetMiB: 2048, OverheadMiB: 256})
	if _, err := a.Reserve(4096); err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a VM over the whole budget: %v", err)
	}
	big, _ := a.Reserve(1024)  // 1280
	small, _ := a.Reserve(512) // 768 more would be 2048: fits
	if s, _ := state(small); s != sandbox.TicketAdmitted {
		t.Fatal("a VM that fits the rest of the budget waits")
	}
	third, _ := a.Reserve(128) // 384 more would overcommit
	if s, _ := state(third); s != sandbox.TicketQueued {
		t.Fatal("a VM over the remaining budget was admitted")
	}
	if _, ok := a.TryHold(128); ok {
		t.Fatal("a ready VM jumped the queue")
	}
	big.Release()
	if s, _ := state(third); s != sandbox.TicketAdmitted {
		t.Fatal("freed memory did not admit the waiting VM")
	}
	if st := a.Stats(); st.UsedMiB > st.MemoryBudgetMiB {
		t.Errorf("overcommitted: %+v", st)
	}
	small.Release()
	third.Release()
}

func TestDefaultAdmission(t *testing.T) {
	tests := []struct {
		h           sandbox.HostLimits
		accel       vmm.Accel
		vms, budget int
	}{
		{sandbox.HostLimits{CPUs: 2, MemTotalMiB: 24105}, vmm.AccelTCG, 2, 24105 - 3013},
		{sandbox.HostLimits{CPUs: 16, MemTotalMiB: 131072}, vmm.AccelKVM, 32, 131072 - 16384},
		{sandbox.HostLimits{CPUs: 64, MemTotalMiB: 8192}, vmm.AccelKVM, 9, 8192 - 1024},
		{sandbox.HostLimits{CPUs: 1, MemTotalMiB: 1024}, vmm.AccelTCG, 1, 128 + 768},
	}
	for _, tc := range tests {
		c := sandbox.DefaultAdmission(tc.h, tc.accel)
		if c.MaxVMs != tc.vms || c.MemoryBudgetMiB != tc.budget || c.Queue != 4*tc.vms {
			t.Errorf("%+v %s: %+v; want %d VMs, %d MiB", tc.h, tc.accel, c, tc.vms, tc.budget)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", tc.h, err)
		}
	}
}

func TestAdmissionBackgroundVMsLeaveRoomForARun(t *testing.T) {
	a := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 4, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256})
	first, ok := a.TryHold(512)
	second, ok2 := a.TryHold(512)
	if !ok || !ok2 {
		t.Fatal("no place for two background VMs on an idle host of four")
	}
	if _, ok := a.TryHold(512); ok {
		t.Fatal("background VMs took more than half the places")
	}
	var runs []*sandbox.Ticket
	for range 2 {
		run, err := a.Reserve(512)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := state(run); s != sandbox.TicketAdmitted {
			t.Fatal("a run waits behind background VMs while places are free")
		}
		runs = append(runs, run)
	}
	first.Release()
	third, ok := a.TryHold(512) // runs keep their half of the places
	if !ok {
		t.Fatal("no background place under the cap")
	}
	queued, _ := a.Reserve(512)
	if _, ok := a.TryHold(512); ok {
		t.Fatal("a background VM went ahead of a waiting run")
	}
	second.Release()
	if s, _ := state(queued); s != sandbox.TicketAdmitted {
		t.Fatal("a released background place did not go to the waiting run")
	}
	for _, r := range append(runs, queued, third) {
		r.Release()
	}
	if st := a.Stats(); st.Running != 0 || st.Background != 0 {
		t.Errorf("stats %+v", st)
	}
	// A host of two: one background VM beside a run (a snapshot build
	// while runs go on); a host of one: only when it is idle.
	two := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 2, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256})
	run, _ := two.Reserve(512)
	if _, ok := two.TryHold(512); !ok {
		t.Error("no background VM beside one run on a host of two")
	}
	run.Release()
	one := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 1, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256})
	if bg, ok := one.TryHold(512); !ok {
		t.Error("no background VM on an idle host of one")
	} else {
		bg.Release()
	}
	small := newAdmission(t, sandbox.AdmissionConfig{MaxVMs: 8, Queue: 2, MemoryBudgetMiB: 1500, OverheadMiB: 256})
	if _, ok := small.TryHold(512); ok {
		t.Fatal("a background VM took the memory a run needs")
	}
}
