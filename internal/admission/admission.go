// Package admission bounds the VMs one process keeps at once and the
// memory they take together: places for runs, a bounded FIFO queue for
// calls that wait, and places that background VMs (ready VMs, snapshot
// builds) hold until a call needs them. It is shared code, not shared
// state: each long-lived front end makes its own Admission. It imports
// neither the core nor a front end; the core asks it for places through
// a small interface of its own (sandbox.Places).
package admission

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/ledger"
	"isopod/internal/vmm"
)

// Admission bounds the VMs one process keeps at once, and the memory they
// may take together: a long-lived front end (isopod-mcp) admits every run
// through it, and the core's ready VMs and snapshot builds take their
// places from it too, so that runs, ready VMs and builds share one VM
// limit and one memory budget. A VM's cost is its guest memory plus
// the VMM's own allowance ([VMMOverheadMiB], what the jail caps a VMM at
// beyond guest RAM), so the budget is never overcommitted by VMs that stay
// within their caps.
//
// A VM that cannot start at once waits in a bounded FIFO queue; one that
// cannot queue is refused at once with [ErrBusy], so that a client or a
// load balancer can try another host. Processes do not share an
// Admission, but with a [ledger.Ledger] (Config.Ledger) they share the
// limits: every place is counted in the state root's ledger, and a place
// is granted only when the places and memory every live process holds
// leave room for it (shared.go).
type Admission struct {
	cfg Config

	mu        sync.Mutex    // guards following
	running   int           // VMs holding a place
	usedMiB   int           // their cost
	queue     []*Ticket     // calls waiting, oldest first
	held      []*Ticket     // background VMs holding a place (TryHold), oldest first
	heldMiB   int           // their cost
	endingVMs int           // of those, VMs asked to end for a waiting call
	endingMiB int           // their cost
	freed     chan struct{} // closed and replaced at every release
	places    []*Ticket     // every admitted ticket, for the ledger
	others    ledger.Usage  // what other processes held at the last look
	tx        *ledger.Tx    // the ledger transaction under way, with a.mu
	watching  bool          // a watchOthers goroutine runs
}

// Config configures an Admission.
type Config struct {
	// MaxVMs is how many VMs may hold a place at once (runs, ready VMs,
	// snapshot builders).
	MaxVMs int
	// Queue is how many may wait for a place; 0: none wait.
	Queue int
	// MemoryBudgetMiB is what all VMs together may cost.
	MemoryBudgetMiB int
	// OverheadMiB is each VM's cost beyond its guest memory.
	OverheadMiB int
	// MinMemMiB is the guest memory of the smallest VM: the budget must
	// hold one.
	MinMemMiB int
	// RunMemMiB is the guest memory of a default-sized run: on a host of
	// more than one place, background VMs leave room for one.
	RunMemMiB int
	// Ledger, when set, is the host-wide record of places this
	// Admission counts its places in and grants them against: the limits
	// above then bound every process that shares it. nil: this process
	// alone.
	Ledger *ledger.Ledger
	// CallKind is what Reserve's places are for in the ledger
	// (ledger.KindRun unless set); CallID names them (a session's id).
	CallKind ledger.Kind
	CallID   string
}

// Validate checks the limits.
func (c Config) Validate() error {
	switch {
	case c.MaxVMs < 1:
		return fmt.Errorf("admission: at least one VM must be allowed (got %d): %w", c.MaxVMs, errdefs.ErrInvalidArgument)
	case c.Queue < 0:
		return fmt.Errorf("admission: a negative queue (%d): %w", c.Queue, errdefs.ErrInvalidArgument)
	case c.OverheadMiB < 0 || c.MinMemMiB < 0 || c.RunMemMiB < 0:
		return fmt.Errorf("admission: a negative size (overhead %d, smallest VM %d, run %d MiB): %w",
			c.OverheadMiB, c.MinMemMiB, c.RunMemMiB, errdefs.ErrInvalidArgument)
	case c.MemoryBudgetMiB < c.MinMemMiB+c.OverheadMiB:
		return fmt.Errorf("admission: a memory budget of %d MiB fits no VM (the smallest costs %d MiB): %w",
			c.MemoryBudgetMiB, c.MinMemMiB+c.OverheadMiB, errdefs.ErrInvalidArgument)
	}
	return nil
}

// VMMOverheadMiB is a VM's cost beyond guest memory under accel: the
// memory the jail lets a VMM use beyond guest RAM.
func VMMOverheadMiB(accel vmm.Accel) int {
	if accel == vmm.AccelKVM {
		return 256
	}
	return 768
}

// Host is what the default limits are derived from: the host's cores
// and memory, the acceleration its VMs get, and the guest memory of the
// smallest VM and of a default-sized run.
type Host struct {
	CPUs        int
	MemTotalMiB int
	Accel       vmm.Accel
	MinMemMiB   int
	RunMemMiB   int
}

// Default derives the limits from the host: the memory budget is
// MemTotal less an eighth (at least 1 GiB) kept for the host; a VM per
// core under TCG, where each running guest keeps a core busy, and two
// under KVM; no more default-sized VMs than the budget holds; and a queue
// four times the VM limit.
func Default(h Host) Config {
	c := Config{OverheadMiB: VMMOverheadMiB(h.Accel), MinMemMiB: h.MinMemMiB, RunMemMiB: h.RunMemMiB}
	keep := max(1024, h.MemTotalMiB/8)
	c.MemoryBudgetMiB = max(h.MemTotalMiB-keep, h.MinMemMiB+c.OverheadMiB)
	perCore := 1
	if h.Accel == vmm.AccelKVM {
		perCore = 2
	}
	c.MaxVMs = max(1, min(perCore*max(h.CPUs, 1), c.MemoryBudgetMiB/(h.RunMemMiB+c.OverheadMiB)))
	c.Queue = 4 * c.MaxVMs
	return c
}

// New returns an Admission with cfg's limits.
func New(cfg Config) (*Admission, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Admission{cfg: cfg, freed: make(chan struct{})}, nil
}

// Config returns the limits.
func (a *Admission) Config() Config { return a.cfg }

// ErrBusy is the refusal of a VM that can neither start nor wait here.
var ErrBusy = fmt.Errorf("busy: %w", errdefs.ErrUnavailable)

// TicketState is where a Ticket is.
type TicketState int

const (
	TicketQueued TicketState = iota
	TicketAdmitted
	TicketReleased
	// TicketLent: a background VM's place, lent to a waiting call while
	// the VM lives on (see [Yield]).
	TicketLent
)

// Ticket is one VM's place: admitted, or waiting in the queue. A nil
// Ticket holds nothing: releasing it does nothing.
type Ticket struct {
	a     *Admission
	cost  int
	yield *Yield // a background VM's; nil for a call
	kind  ledger.Kind
	id    string

	// Guarded by a.mu:
	state   TicketState
	changed chan struct{} // closed and replaced when state or position changes
	ending  bool          // a background VM asked to end
	lentTo  *Ticket       // the call a TicketLent place is lent to
	lent    []*Ticket     // background places lent to this call
	// keeps counts the Keeps not yet done; releaseDue, a Release that
	// waits for them (keep.go).
	keeps      int
	releaseDue bool
}

// Reserve takes a place for a VM of memMiB of guest memory: admitted at
// once when the VM limit and the budget allow and nobody waits, else at
// the back of the queue. Background VMs give their places to calls
// ([Yield]): a call they make room for waits only for them to end, even
// past the queue limit. A full queue is ErrBusy; a VM that alone costs
// more than the budget is refused too (it would never start here).
func (a *Admission) Reserve(memMiB int) (*Ticket, error) {
	cost := memMiB + a.cfg.OverheadMiB
	if cost > a.cfg.MemoryBudgetMiB {
		return nil, fmt.Errorf("a VM of %d MiB costs %d MiB with its VMM, more than this host's memory budget of %d MiB: %w",
			memMiB, cost, a.cfg.MemoryBudgetMiB, errdefs.ErrUnavailable)
	}
	if err := a.lock(); err != nil {
		a.unlock()
		return nil, err
	}
	t := &Ticket{a: a, cost: cost, kind: cmp.Or(a.cfg.CallKind, ledger.KindRun), id: a.cfg.CallID, changed: make(chan struct{})}
	if len(a.queue) == 0 && a.fitsLocked(cost) {
		a.admitLocked(t)
		a.unlock()
		return t, nil
	}
	if len(a.queue) >= a.cfg.Queue && (len(a.queue) > 0 || !a.reclaimableLocked(cost)) {
		err := fmt.Errorf("%s and %d calls wait here (limit %d): %w", a.heldTextLocked(), len(a.queue), a.cfg.Queue, ErrBusy)
		a.unlock()
		return nil, err
	}
	a.queue = append(a.queue, t)
	a.unlockEnding(a.advanceLocked())
	return t, nil
}

// Preconditions: a.mu is held.
func (a *Admission) fitsLocked(cost int) bool {
	return a.running+a.others.Places < a.cfg.MaxVMs && a.usedMiB+a.others.CostMiB+cost <= a.cfg.MemoryBudgetMiB
}

// Preconditions: a.mu is held.
func (a *Admission) admitLocked(t *Ticket) {
	a.running++
	a.usedMiB += t.cost
	a.places = append(a.places, t)
	if t.yield != nil {
		a.held = append(a.held, t)
		a.heldMiB += t.cost
		a.watchLocked()
	}
	t.setLocked(TicketAdmitted)
}

// freeLocked gives back an admitted t's place.
//
// Preconditions: a.mu is held.
func (a *Admission) freeLocked(t *Ticket) {
	a.running--
	a.usedMiB -= t.cost
	a.places = slices.DeleteFunc(a.places, func(p *Ticket) bool { return p == t })
	if t.yield == nil {
		return
	}
	a.held = slices.DeleteFunc(a.held, func(h *Ticket) bool { return h == t })
	a.heldMiB -= t.cost
	if t.ending {
		t.ending = false
		a.endingVMs--
		a.endingMiB -= t.cost
	}
}

// Preconditions: a.mu is held.
func (t *Ticket) setLocked(s TicketState) {
	t.state = s
	close(t.changed)
	t.changed = make(chan struct{})
}

// advanceLocked admits queued VMs, oldest first, while they fit, taking
// places from background VMs for them (reclaimLocked); the rest learn
// their new positions. It returns the background VMs' End functions to
// call once a.mu is released.
//
// Preconditions: a.mu is held.
func (a *Admission) advanceLocked() (ends []func()) {
	n := 0
	for n < len(a.queue) {
		t := a.queue[n]
		if !a.fitsLocked(t.cost) {
			ends = append(ends, a.reclaimLocked(t)...)
			if !a.fitsLocked(t.cost) {
				break
			}
		}
		a.admitLocked(t)
		n++
	}
	if n == 0 {
		return ends
	}
	a.queue = append(a.queue[:0], a.queue[n:]...)
	for _, t := range a.queue {
		t.setLocked(TicketQueued)
	}
	return ends
}

// unlockEnding releases a.mu (and the ledger) and asks the background
// VMs in ends to end.
func (a *Admission) unlockEnding(ends []func()) {
	a.unlock()
	for _, end := range ends {
		go end()
	}
}

// Status says where t is: its state and, while queued, its position
// (1 is next) and the channel closed at its next change.
func (t *Ticket) Status() (state TicketState, position int, changed <-chan struct{}) {
	t.a.mu.Lock()
	defer t.a.mu.Unlock()
	for i, q := range t.a.queue {
		if q == t {
			position = i + 1
		}
	}
	return t.state, position, t.changed
}

// Wait blocks until t is admitted. When ctx ends first, t leaves the
// queue (it is released) and ctx's error is returned.
func (t *Ticket) Wait(ctx context.Context) error { return t.wait(ctx, 0) }

// WaitBounded is Wait, except that a call still waiting after bound while
// other processes hold places (the ledger's) gives up as [ErrBusy]: a
// wait on this process's own VMs alone goes on.
func (t *Ticket) WaitBounded(ctx context.Context, bound time.Duration) error {
	return t.wait(ctx, bound)
}

func (t *Ticket) wait(ctx context.Context, bound time.Duration) error {
	poll := newBackoff(t.a.cfg.Ledger != nil)
	defer poll.stop()
	var deadline <-chan time.Time
	if bound > 0 {
		timer := time.NewTimer(bound)
		defer timer.Stop()
		deadline = timer.C
	}
	for {
		state, _, changed := t.Status()
		switch state {
		case TicketAdmitted:
			return nil
		case TicketReleased, TicketLent:
			return errors.New("admission: the ticket was released")
		}
		select {
		case <-changed:
		case <-poll.c():
			// Other processes may have given places back.
			t.a.retry()
		case <-deadline:
			deadline = nil
			if err := t.giveUp(bound); err != nil {
				return err
			}
		case <-ctx.Done():
			t.Release()
			return ctx.Err()
		}
	}
}

// Release gives t's place (or its place in the queue) back. A lent
// background place is the call's: releasing it only says that its VM is
// gone (ended, or claimed by a run with a place of its own). A call's
// release gives each place lent to it whose VM is still there back to
// that VM, which is asked to end. While t is kept ([Ticket.Keep]), the
// release waits for the last Keep to be done. Idempotent.
func (t *Ticket) Release() {
	if t == nil {
		return
	}
	a := t.a
	a.lock() // without the ledger, the place is still given back here
	if t.deferRelease() {
		a.unlock()
		return
	}
	a.unlockEnding(t.releaseLocked())
}

// releaseLocked is Release's work; it returns the End functions to call
// once a.mu is released.
//
// Preconditions: a.mu is held.
func (t *Ticket) releaseLocked() []func() {
	a := t.a
	switch t.state {
	case TicketReleased:
		return nil
	case TicketLent:
		t.lentTo = nil
		t.setLocked(TicketReleased)
		return nil
	case TicketAdmitted:
		a.freeLocked(t)
	case TicketQueued:
		a.queue = slices.DeleteFunc(a.queue, func(q *Ticket) bool { return q == t })
		for _, q := range a.queue {
			q.setLocked(TicketQueued)
		}
	}
	var ends []func()
	for _, v := range t.lent {
		if v.state == TicketLent && v.lentTo == t {
			v.lentTo = nil
			a.admitLocked(v)
			ends = append(ends, a.endLocked(v))
		}
	}
	t.lent = nil
	t.setLocked(TicketReleased)
	close(a.freed)
	a.freed = make(chan struct{})
	return append(ends, a.advanceLocked()...)
}

// Stats is a moment's view of an Admission.
type Stats struct {
	Running    int `json:"running"`
	Background int `json:"background"`
	// Lendable: background places a call takes at once (ready VMs).
	Lendable        int `json:"lendable"`
	Queued          int `json:"queued"`
	UsedMiB         int `json:"used_mib"`
	MaxVMs          int `json:"max_vms"`
	QueueMax        int `json:"queue_max"`
	MemoryBudgetMiB int `json:"memory_budget_mib"`
	// OtherPlaces and OtherMiB are what other processes sharing the
	// ledger held at the last look.
	OtherPlaces int `json:"other_places,omitempty"`
	OtherMiB    int `json:"other_mib,omitempty"`
}

// Stats reports what holds places and waits now.
func (a *Admission) Stats() Stats {
	a.mu.Lock()
	defer a.mu.Unlock()
	lendable := 0
	for _, t := range a.held {
		if t.yield.Lend && !t.ending {
			lendable++
		}
	}
	return Stats{Running: a.running, Background: len(a.held), Lendable: lendable, Queued: len(a.queue),
		UsedMiB: a.usedMiB, MaxVMs: a.cfg.MaxVMs, QueueMax: a.cfg.Queue, MemoryBudgetMiB: a.cfg.MemoryBudgetMiB,
		OtherPlaces: a.others.Places, OtherMiB: a.others.CostMiB}
}
