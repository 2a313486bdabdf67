package admission

import (
	"cmp"
	"time"

	"isopod/internal/ledger"
)

// Background VMs in an Admission. A long-lived front end keeps VMs no
// call asked for: ready VMs and snapshot builds. They take a place only
// when it is free and no call waits, and give it to a call that needs it
// at once: calls always come first, for the VM limit and for the memory
// budget alike. When a call at the head of the queue does not fit, and
// would with the background VMs gone, they give way newest first until it
// does: a lendable place (a paused ready VM) passes to the call at once,
// the VM living on for the call's run to claim or end; any other VM is
// asked to end, and its place comes back when it has.

// Yield is how a background VM gives its place to a call.
type Yield struct {
	// End asks the VM's holder to end it (cancel a build, discard a
	// ready VM) and then release its place. It is called at most once
	// per request, on a goroutine of its own. Required.
	End func()
	// Lend lets a waiting call take the place at once while the VM lives
	// on (see [Ticket.AllowLend]). The call's run must claim the VM, or
	// end it before its own VM starts ([Ticket.LentTo]); should the call
	// end first, the place goes back to the VM and End is called.
	Lend bool
	// Kind is what the place is for in the ledger: ledger.KindReady or
	// ledger.KindBuild (the default).
	Kind ledger.Kind
}

// TryHold takes a place for a background VM (a ready VM, a snapshot
// build) at once or not at all: ok is false when calls wait, when no place
// is free, or when background VMs already hold half the places (one on a
// host of one or two). On a host of more than one place it must also leave
// memory for a default-sized run. y says how the VM gives way to a call;
// one without y.End is refused.
func (a *Admission) TryHold(memMiB int, y Yield) (t *Ticket, ok bool) {
	if y.End == nil {
		return nil, false
	}
	err := a.lock()
	defer a.unlock()
	t = &Ticket{a: a, cost: memMiB + a.cfg.OverheadMiB, yield: &y, kind: cmp.Or(y.Kind, ledger.KindBuild), changed: make(chan struct{})}
	// Calls of other processes waiting come first too.
	if err != nil || len(a.queue) > 0 || a.others.Waiting > 0 || a.running+a.others.Places >= a.cfg.MaxVMs ||
		len(a.held) >= max(1, a.cfg.MaxVMs/2) || a.usedMiB+a.others.CostMiB+t.cost+a.spareMiB() > a.cfg.MemoryBudgetMiB {
		return nil, false
	}
	a.admitLocked(t)
	return t, true
}

// spareMiB is the memory a background VM must leave for a
// default-sized run: none on a host of one place.
func (a *Admission) spareMiB() int {
	if a.cfg.MaxVMs > 1 {
		return a.cfg.RunMemMiB + a.cfg.OverheadMiB
	}
	return 0
}

// CanHold reports whether a background VM of memMiB fits the budget.
func (a *Admission) CanHold(memMiB int) bool {
	return memMiB+a.cfg.OverheadMiB+a.spareMiB() <= a.cfg.MemoryBudgetMiB
}

// Freed returns a channel closed at the next release; with a ledger,
// also after a while, since other processes' releases are not seen.
func (a *Admission) Freed() <-chan struct{} {
	a.mu.Lock()
	freed := a.freed
	a.mu.Unlock()
	if a.cfg.Ledger == nil {
		return freed
	}
	ch := make(chan struct{})
	go func() {
		t := time.NewTimer(othersPoll)
		defer t.Stop()
		select {
		case <-freed:
		case <-t.C:
		}
		close(ch)
	}()
	return ch
}

// AllowLend makes a background place lendable from now on (a ready VM
// once it is made and waits, paused, for a claim).
func (t *Ticket) AllowLend() {
	if t == nil || t.yield == nil {
		return
	}
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	t.yield.Lend = true
}

// LentTo reports whether t is a background place lent to the call that
// holds place, its VM still there.
func (t *Ticket) LentTo(place *Ticket) bool {
	if t == nil || place == nil {
		return false
	}
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	return t.state == TicketLent && t.lentTo == place
}

// reclaimableLocked reports whether a call of cost would fit were every
// background VM gone.
//
// Preconditions: a.mu is held.
func (a *Admission) reclaimableLocked(cost int) bool {
	return a.running-len(a.held)+a.others.Places < a.cfg.MaxVMs &&
		a.usedMiB-a.heldMiB+a.others.CostMiB+cost <= a.cfg.MemoryBudgetMiB
}

// reclaimLocked makes room for the waiting call t from background VMs,
// newest first, until t fits once the VMs asked to end have: a lendable
// place of a VM no bigger than t is lent to t at once (a run claims a
// ready VM of its own size only), any other VM is asked to end. Nothing is
// asked of them when even all of them would not make room. It returns the
// End functions to call once a.mu is released.
//
// Preconditions: a.mu is held.
func (a *Admission) reclaimLocked(t *Ticket) (ends []func()) {
	if !a.reclaimableLocked(t.cost) {
		return nil
	}
	fits := func() bool {
		return a.running-a.endingVMs+a.others.Places < a.cfg.MaxVMs &&
			a.usedMiB-a.endingMiB+a.others.CostMiB+t.cost <= a.cfg.MemoryBudgetMiB
	}
	for i := len(a.held) - 1; i >= 0 && !fits(); i-- {
		v := a.held[i]
		switch {
		case v.ending:
		case v.yield.Lend && v.cost <= t.cost: // the call's place covers the VM
			a.freeLocked(v) // removes a.held[i] only
			v.lentTo = t
			t.lent = append(t.lent, v)
			v.setLocked(TicketLent)
		default:
			ends = append(ends, a.endLocked(v))
		}
	}
	return ends
}

// endLocked marks the admitted background VM v as asked to end and
// returns its End.
//
// Preconditions: a.mu is held.
func (a *Admission) endLocked(v *Ticket) func() {
	v.ending = true
	a.endingVMs++
	a.endingMiB += v.cost
	return v.yield.End
}
