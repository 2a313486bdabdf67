package admission_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

func newAdmission(t *testing.T, cfg admission.Config) *admission.Admission {
	t.Helper()
	a, err := admission.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// bg is a background VM's Yield that does nothing when asked to end.
var bg = admission.Yield{End: func() {}}

func state(t *admission.Ticket) (admission.TicketState, int) {
	s, pos, _ := t.Status()
	return s, pos
}

func TestAdmissionLimitsAndQueue(t *testing.T) {
	a := newAdmission(t, admission.Config{MaxVMs: 2, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	var tickets []*admission.Ticket
	for i := range 4 {
		tk, err := a.Reserve(512)
		if err != nil {
			t.Fatalf("reserve %d: %v", i, err)
		}
		tickets = append(tickets, tk)
	}
	if _, err := a.Reserve(512); !errors.Is(err, admission.ErrBusy) || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a fifth reserve: %v, want busy (unavailable)", err)
	}
	for i, want := range []admission.TicketState{admission.TicketAdmitted, admission.TicketAdmitted, admission.TicketQueued, admission.TicketQueued} {
		if got, pos := state(tickets[i]); got != want || (want == admission.TicketQueued && pos != i-1) {
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
	a := newAdmission(t, admission.Config{MaxVMs: 10, Queue: 5, MemoryBudgetMiB: 2048, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	if _, err := a.Reserve(4096); err == nil || !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("a VM over the whole budget: %v", err)
	}
	big, _ := a.Reserve(1024)  // 1280
	small, _ := a.Reserve(512) // 768 more would be 2048: fits
	if s, _ := state(small); s != admission.TicketAdmitted {
		t.Fatal("a VM that fits the rest of the budget waits")
	}
	third, _ := a.Reserve(128) // 384 more would overcommit
	if s, _ := state(third); s != admission.TicketQueued {
		t.Fatal("a VM over the remaining budget was admitted")
	}
	if _, ok := a.TryHold(128, bg); ok {
		t.Fatal("a ready VM jumped the queue")
	}
	big.Release()
	if s, _ := state(third); s != admission.TicketAdmitted {
		t.Fatal("freed memory did not admit the waiting VM")
	}
	if st := a.Stats(); st.UsedMiB > st.MemoryBudgetMiB {
		t.Errorf("overcommitted: %+v", st)
	}
	small.Release()
	third.Release()
}

func TestDefault(t *testing.T) {
	host := func(cpus, memMiB int, accel vmm.Accel) admission.Host {
		return admission.Host{CPUs: cpus, MemTotalMiB: memMiB, Accel: accel, MinMemMiB: 128, RunMemMiB: 512}
	}
	tests := []struct {
		h           admission.Host
		vms, budget int
	}{
		{host(2, 24105, vmm.AccelTCG), 2, 24105 - 3013},
		{host(16, 131072, vmm.AccelKVM), 32, 131072 - 16384},
		{host(64, 8192, vmm.AccelKVM), 9, 8192 - 1024},
		{host(1, 1024, vmm.AccelTCG), 1, 128 + 768},
	}
	for _, tc := range tests {
		c := admission.Default(tc.h)
		if c.MaxVMs != tc.vms || c.MemoryBudgetMiB != tc.budget || c.Queue != 4*tc.vms {
			t.Errorf("%+v: %+v; want %d VMs, %d MiB", tc.h, c, tc.vms, tc.budget)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("%+v: %v", tc.h, err)
		}
	}
}

func TestAdmissionBackgroundVMsLeaveRoomForARun(t *testing.T) {
	a := newAdmission(t, admission.Config{MaxVMs: 4, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	first, ok := a.TryHold(512, bg)
	second, ok2 := a.TryHold(512, bg)
	if !ok || !ok2 {
		t.Fatal("no place for two background VMs on an idle host of four")
	}
	if _, ok := a.TryHold(512, bg); ok {
		t.Fatal("background VMs took more than half the places")
	}
	var runs []*admission.Ticket
	for range 2 {
		run, err := a.Reserve(512)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := state(run); s != admission.TicketAdmitted {
			t.Fatal("a run waits behind background VMs while places are free")
		}
		runs = append(runs, run)
	}
	first.Release()
	third, ok := a.TryHold(512, bg) // runs keep their half of the places
	if !ok {
		t.Fatal("no background place under the cap")
	}
	queued, _ := a.Reserve(512)
	if _, ok := a.TryHold(512, bg); ok {
		t.Fatal("a background VM went ahead of a waiting run")
	}
	second.Release()
	if s, _ := state(queued); s != admission.TicketAdmitted {
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
	two := newAdmission(t, admission.Config{MaxVMs: 2, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	run, _ := two.Reserve(512)
	if _, ok := two.TryHold(512, bg); !ok {
		t.Error("no background VM beside one run on a host of two")
	}
	run.Release()
	one := newAdmission(t, admission.Config{MaxVMs: 1, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	if held, ok := one.TryHold(512, bg); !ok {
		t.Error("no background VM on an idle host of one")
	} else {
		held.Release()
	}
	small := newAdmission(t, admission.Config{MaxVMs: 8, Queue: 2, MemoryBudgetMiB: 1500, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	if _, ok := small.TryHold(512, bg); ok {
		t.Fatal("a background VM took the memory a run needs")
	}
}

// ender is a background VM's Yield that records when it is asked to end.
type ender struct{ asked chan struct{} }

func newEnder() *ender { return &ender{asked: make(chan struct{}, 1)} }

func (e *ender) yield(lend bool) admission.Yield {
	return admission.Yield{Lend: lend, End: func() { e.asked <- struct{}{} }}
}

// wasAsked reports whether the VM was asked to end within a second.
func (e *ender) wasAsked() bool {
	select {
	case <-e.asked:
		return true
	case <-time.After(time.Second):
		return false
	}
}

// notAsked reports that the VM was not asked to end (now).
func (e *ender) notAsked() bool {
	select {
	case <-e.asked:
		return false
	default:
		return true
	}
}

// waitAdmitted waits a few seconds for t to be admitted.
func waitAdmitted(t *testing.T, tk *admission.Ticket, what string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tk.Wait(ctx); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// A call never waits for a background VM: a lendable place (a ready VM)
// passes to it at once, any other background VM (a snapshot build) is
// asked to end and its place goes to the call when it has.
func TestAdmissionCallsTakeBackgroundPlaces(t *testing.T) {
	cfg := admission.Config{MaxVMs: 1, Queue: 4, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512}

	t.Run("a ready VM's place is lent at once", func(t *testing.T) {
		a := newAdmission(t, cfg)
		e := newEnder()
		ready, ok := a.TryHold(512, e.yield(false))
		if !ok {
			t.Fatal("no place for a ready VM on an idle host")
		}
		ready.AllowLend()
		call, err := a.Reserve(512)
		if err != nil {
			t.Fatal(err)
		}
		if s, _ := state(call); s != admission.TicketAdmitted {
			t.Fatalf("a call behind a ready VM: state %d; want admitted at once", s)
		}
		if !ready.LentTo(call) || !e.notAsked() {
			t.Fatalf("the ready VM's place is not lent to the call (or it was asked to end)")
		}
		if st := a.Stats(); st.Running != 1 || st.Background != 0 {
			t.Errorf("stats with a lent place %+v; want the call's place only", st)
		}
		// The call ends without its run claiming or ending the VM: the
		// place goes back to the VM, which is asked to end.
		call.Release()
		if !e.wasAsked() {
			t.Fatal("a VM whose lent place came back was not asked to end")
		}
		if st := a.Stats(); st.Running != 1 || st.Background != 1 {
			t.Errorf("stats after the call %+v; want the VM's place back", st)
		}
		ready.Release()
		if st := a.Stats(); st.Running != 0 || st.UsedMiB != 0 {
			t.Errorf("stats at the end %+v", st)
		}
	})

	t.Run("a bigger ready VM ends instead", func(t *testing.T) {
		// The call could not claim it, and its place would not cover it.
		a := newAdmission(t, cfg)
		e := newEnder()
		ready, _ := a.TryHold(1024, e.yield(true))
		call, _ := a.Reserve(512)
		if ready.LentTo(call) || !e.wasAsked() {
			t.Fatal("a ready VM bigger than the call was lent, or not asked to end")
		}
		ready.Release()
		waitAdmitted(t, call, "the call after the ready VM ended")
		call.Release()
	})

	t.Run("a claimed lent VM is the call's", func(t *testing.T) {
		a := newAdmission(t, cfg)
		e := newEnder()
		ready, _ := a.TryHold(512, e.yield(true))
		call, _ := a.Reserve(512)
		ready.Release() // the run claimed it
		if ready.LentTo(call) {
			t.Error("a claimed VM is still lent")
		}
		if st := a.Stats(); st.Running != 1 {
			t.Errorf("stats %+v; want the call's place", st)
		}
		call.Release()
		if !e.notAsked() {
			t.Error("a claimed VM was asked to end")
		}
		if st := a.Stats(); st.Running != 0 || st.UsedMiB != 0 {
			t.Errorf("stats at the end %+v", st)
		}
	})

	t.Run("a build ends for a call", func(t *testing.T) {
		a := newAdmission(t, admission.Config{MaxVMs: 1, Queue: 0, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
		e := newEnder()
		build, _ := a.TryHold(512, e.yield(false))
		freed := a.Freed()
		call, err := a.Reserve(512) // no queue, but the build makes room
		if err != nil {
			t.Fatalf("a call behind a build on a host without a queue: %v", err)
		}
		if !e.wasAsked() {
			t.Fatal("the build was not asked to end")
		}
		if s, _ := state(call); s != admission.TicketQueued {
			t.Fatalf("state %d before the build ended; want queued", s)
		}
		if _, err := a.Reserve(512); !errors.Is(err, admission.ErrBusy) {
			t.Errorf("a second call: %v; want busy", err)
		}
		build.Release()
		select {
		case <-freed:
		default:
			t.Error("Freed not closed by a release")
		}
		waitAdmitted(t, call, "the call after the build ended")
		if _, ok := a.TryHold(512, bg); ok {
			t.Error("the build took a place back while the call runs")
		}
		call.Release()
		if again, ok := a.TryHold(512, bg); !ok {
			t.Error("no place for the build once the call ended")
		} else {
			again.Release()
		}
	})

	t.Run("memory too", func(t *testing.T) {
		// Four places, memory for two VMs: a background VM and a run
		// hold it all, and the next call takes the background VM's.
		a := newAdmission(t, admission.Config{MaxVMs: 4, Queue: 4, MemoryBudgetMiB: 2*768 + 100, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
		e := newEnder()
		build, ok := a.TryHold(512, e.yield(false))
		if !ok {
			t.Fatal("no place for a background VM")
		}
		first, _ := a.Reserve(512)
		second, _ := a.Reserve(512)
		if !e.wasAsked() {
			t.Fatal("a background VM holding the memory a call needs was not asked to end")
		}
		build.Release()
		waitAdmitted(t, second, "the call after the background VM ended")
		if st := a.Stats(); st.UsedMiB > st.MemoryBudgetMiB {
			t.Errorf("overcommitted: %+v", st)
		}
		first.Release()
		second.Release()
	})

	t.Run("newest first, and only what the call needs", func(t *testing.T) {
		a := newAdmission(t, admission.Config{MaxVMs: 4, Queue: 4, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
		older, newer := newEnder(), newEnder()
		a.TryHold(512, older.yield(false))
		newest, _ := a.TryHold(512, newer.yield(false))
		r1, _ := a.Reserve(512)
		r2, _ := a.Reserve(512)
		r3, _ := a.Reserve(512)
		if !newer.wasAsked() || !older.notAsked() {
			t.Fatal("not the newest background VM alone was asked to end")
		}
		newest.Release()
		waitAdmitted(t, r3, "the third call")
		for _, r := range []*admission.Ticket{r1, r2, r3} {
			r.Release()
		}
	})

	t.Run("none when it would not help", func(t *testing.T) {
		// Three places and memory for three VMs of 512: a background VM
		// and two runs. A call of 1024 would not fit even with the
		// background VM gone: it waits for a run, and the VM stays.
		a := newAdmission(t, admission.Config{MaxVMs: 3, Queue: 4, MemoryBudgetMiB: 3 * 768, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
		e := newEnder()
		held, ok := a.TryHold(512, e.yield(false))
		r1, _ := a.Reserve(512)
		r2, _ := a.Reserve(512)
		if !ok || r1 == nil || r2 == nil {
			t.Fatal("setup: no room")
		}
		big, err := a.Reserve(1024)
		if err != nil {
			t.Fatal(err)
		}
		if e.wasAsked() {
			t.Fatal("a background VM was asked to end for a call it could not make room for")
		}
		r1.Release()
		if !e.wasAsked() {
			t.Fatal("once a run ended, the background VM was not asked to end for the rest")
		}
		held.Release()
		waitAdmitted(t, big, "the big call")
		r2.Release()
		big.Release()
	})
}
