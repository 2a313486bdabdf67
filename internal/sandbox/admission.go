package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Admission bounds the VMs one process keeps at once, and the memory they
// may take together: a long-lived front end (isopod-mcp) admits every run
// through it, and the warm pool is to hold its ready VMs and snapshot
// builders through it too, so that runs, ready VMs and builders share one
// VM limit and one memory budget. A VM's cost is its guest memory plus
// the VMM's own allowance ([VMMOverheadMiB], what the jail caps a VMM at
// beyond guest RAM), so the budget is never overcommitted by VMs that stay
// within their caps.
//
// A VM that cannot start at once waits in a bounded FIFO queue; one that
// cannot queue is refused at once with [ErrBusy], so that a client or a
// load balancer can try another host. Processes do not share an
// Admission: CLI runs on the same host are outside it.
type Admission struct {
	cfg AdmissionConfig

	mu         sync.Mutex // guards following
	running    int        // VMs holding a place
	background int        // of those, background VMs (TryHold)
	usedMiB    int        // their cost
	queue      []*Ticket  // waiting, oldest first
}

// AdmissionConfig configures an Admission.
type AdmissionConfig struct {
	// MaxVMs is how many VMs may hold a place at once (runs, ready VMs,
	// snapshot builders).
	MaxVMs int
	// Queue is how many may wait for a place; 0: none wait.
	Queue int
	// MemoryBudgetMiB is what all VMs together may cost.
	MemoryBudgetMiB int
	// OverheadMiB is each VM's cost beyond its guest memory.
	OverheadMiB int
}

// Validate checks the limits.
func (c AdmissionConfig) Validate() error {
	switch {
	case c.MaxVMs < 1:
		return fmt.Errorf("admission: at least one VM must be allowed (got %d): %w", c.MaxVMs, errdefs.ErrInvalidArgument)
	case c.Queue < 0:
		return fmt.Errorf("admission: a negative queue (%d): %w", c.Queue, errdefs.ErrInvalidArgument)
	case c.OverheadMiB < 0:
		return fmt.Errorf("admission: a negative overhead (%d MiB): %w", c.OverheadMiB, errdefs.ErrInvalidArgument)
	case c.MemoryBudgetMiB < MinMemMiB+c.OverheadMiB:
		return fmt.Errorf("admission: a memory budget of %d MiB fits no VM (the smallest costs %d MiB): %w",
			c.MemoryBudgetMiB, MinMemMiB+c.OverheadMiB, errdefs.ErrInvalidArgument)
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

// DefaultAdmission derives the limits from the host: the memory budget is
// MemTotal less an eighth (at least 1 GiB) kept for the host; a VM per
// core under TCG, where each running guest keeps a core busy, and two
// under KVM; no more default-sized VMs than the budget holds; and a queue
// four times the VM limit.
func DefaultAdmission(h HostLimits, accel vmm.Accel) AdmissionConfig {
	c := AdmissionConfig{OverheadMiB: VMMOverheadMiB(accel)}
	keep := max(1024, h.MemTotalMiB/8)
	c.MemoryBudgetMiB = max(h.MemTotalMiB-keep, MinMemMiB+c.OverheadMiB)
	perCore := 1
	if accel == vmm.AccelKVM {
		perCore = 2
	}
	c.MaxVMs = max(1, min(perCore*max(h.CPUs, 1), c.MemoryBudgetMiB/(DefaultMemMiB+c.OverheadMiB)))
	c.Queue = 4 * c.MaxVMs
	return c
}

// AccelGuess is the acceleration a VM would get now, without booting
// one; TCG when it cannot be told.
func (s *Service) AccelGuess(ctx context.Context) vmm.Accel {
	d, err := s.driver(ctx)
	if err != nil {
		return vmm.AccelTCG
	}
	r, ok := d.(vmm.Restorer)
	if !ok {
		return vmm.AccelTCG
	}
	id, err := r.SnapshotIdentity(ctx)
	if err != nil || id.Accel == "" {
		return vmm.AccelTCG
	}
	return id.Accel
}

// NewAdmission returns an Admission with cfg's limits.
func NewAdmission(cfg AdmissionConfig) (*Admission, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Admission{cfg: cfg}, nil
}

// Config returns the limits.
func (a *Admission) Config() AdmissionConfig { return a.cfg }

// ErrBusy is the refusal of a VM that can neither start nor wait here.
var ErrBusy = fmt.Errorf("busy: %w", errdefs.ErrUnavailable)

// TicketState is where a Ticket is.
type TicketState int

const (
	TicketQueued TicketState = iota
	TicketAdmitted
	TicketReleased
)

// Ticket is one VM's place: admitted, or waiting in the queue.
type Ticket struct {
	a          *Admission
	cost       int
	background bool
	state      TicketState   // guarded by a.mu
	changed    chan struct{} // closed and replaced when state or position changes; guarded by a.mu
}

// Reserve takes a place for a VM of memMiB of guest memory: admitted at
// once when the VM limit and the budget allow and nobody waits, else at
// the back of the queue. A full queue is ErrBusy; a VM that alone costs
// more than the budget is refused too (it would never start here).
func (a *Admission) Reserve(memMiB int) (*Ticket, error) {
	cost := memMiB + a.cfg.OverheadMiB
	if cost > a.cfg.MemoryBudgetMiB {
		return nil, fmt.Errorf("a VM of %d MiB costs %d MiB with its VMM, more than this host's memory budget of %d MiB: %w",
			memMiB, cost, a.cfg.MemoryBudgetMiB, errdefs.ErrUnavailable)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	t := &Ticket{a: a, cost: cost, changed: make(chan struct{})}
	if len(a.queue) == 0 && a.fitsLocked(cost) {
		a.admitLocked(t)
		return t, nil
	}
	if len(a.queue) >= a.cfg.Queue {
		return nil, fmt.Errorf("%d VMs hold this host's places (limit %d, %d of %d MiB) and %d calls wait (limit %d): %w",
			a.running, a.cfg.MaxVMs, a.usedMiB, a.cfg.MemoryBudgetMiB, len(a.queue), a.cfg.Queue, ErrBusy)
	}
	a.queue = append(a.queue, t)
	return t, nil
}

// TryHold takes a place for a background VM (a ready VM, a snapshot
// build) at once or not at all: ok is false when calls wait, when no place
// is free, or when background VMs already hold half the places (one on a
// host of one or two). On a host of more than one place it must also leave
// memory for a default-sized run. So background VMs never hold every
// place while runs could use one.
func (a *Admission) TryHold(memMiB int) (t *Ticket, ok bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t = &Ticket{a: a, cost: memMiB + a.cfg.OverheadMiB, background: true, changed: make(chan struct{})}
	spare := 0
	if a.cfg.MaxVMs > 1 {
		spare = DefaultMemMiB + a.cfg.OverheadMiB
	}
	if len(a.queue) > 0 || a.running >= a.cfg.MaxVMs || a.background >= max(1, a.cfg.MaxVMs/2) ||
		a.usedMiB+t.cost+spare > a.cfg.MemoryBudgetMiB {
		return nil, false
	}
	a.admitLocked(t)
	return t, true
}

// HoldVM adapts TryHold to sandbox.Options.HoldVM.
func (a *Admission) HoldVM(memMiB int) (release func(), ok bool) {
	t, ok := a.TryHold(memMiB)
	if !ok {
		return nil, false
	}
	return t.Release, true
}

// Preconditions: a.mu is held.
func (a *Admission) fitsLocked(cost int) bool {
	return a.running < a.cfg.MaxVMs && a.usedMiB+cost <= a.cfg.MemoryBudgetMiB
}

// Preconditions: a.mu is held.
func (a *Admission) admitLocked(t *Ticket) {
	a.running++
	a.usedMiB += t.cost
	if t.background {
		a.background++
	}
	t.setLocked(TicketAdmitted)
}

// Preconditions: a.mu is held.
func (t *Ticket) setLocked(s TicketState) {
	t.state = s
	close(t.changed)
	t.changed = make(chan struct{})
}

// advanceLocked admits queued VMs, oldest first, while they fit; the rest
// learn their new positions.
//
// Preconditions: a.mu is held.
func (a *Admission) advanceLocked() {
	n := 0
	for n < len(a.queue) && a.fitsLocked(a.queue[n].cost) {
		a.admitLocked(a.queue[n])
		n++
	}
	if n == 0 {
		return
	}
	a.queue = append(a.queue[:0], a.queue[n:]...)
	for _, t := range a.queue {
		t.setLocked(TicketQueued)
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
func (t *Ticket) Wait(ctx context.Context) error {
	for {
		state, _, changed := t.Status()
		switch state {
		case TicketAdmitted:
			return nil
		case TicketReleased:
			return errors.New("admission: the ticket was released")
		}
		select {
		case <-changed:
		case <-ctx.Done():
			t.Release()
			return ctx.Err()
		}
	}
}

// Release gives t's place (or its place in the queue) back. Idempotent.
func (t *Ticket) Release() {
	a := t.a
	a.mu.Lock()
	defer a.mu.Unlock()
	switch t.state {
	case TicketReleased:
		return
	case TicketAdmitted:
		a.running--
		a.usedMiB -= t.cost
		if t.background {
			a.background--
		}
	case TicketQueued:
		for i, q := range a.queue {
			if q == t {
				a.queue = append(a.queue[:i], a.queue[i+1:]...)
				break
			}
		}
		for _, q := range a.queue {
			q.setLocked(TicketQueued)
		}
	}
	t.setLocked(TicketReleased)
	a.advanceLocked()
}

// AdmissionStats is a moment's view of an Admission.
type AdmissionStats struct {
	Running         int `json:"running"`
	Background      int `json:"background"`
	Queued          int `json:"queued"`
	UsedMiB         int `json:"used_mib"`
	MaxVMs          int `json:"max_vms"`
	QueueMax        int `json:"queue_max"`
	MemoryBudgetMiB int `json:"memory_budget_mib"`
}

// Stats reports what holds places and waits now.
func (a *Admission) Stats() AdmissionStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return AdmissionStats{Running: a.running, Background: a.background, Queued: len(a.queue), UsedMiB: a.usedMiB,
		MaxVMs: a.cfg.MaxVMs, QueueMax: a.cfg.Queue, MemoryBudgetMiB: a.cfg.MemoryBudgetMiB}
}
