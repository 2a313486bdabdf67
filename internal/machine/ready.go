package machine

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"isopod/internal/admission"
	"isopod/internal/ledger"
)

// Ready VMs, for a front end that lives long (the MCP server). A warm run
// still starts its VMM, loads the snapshot's device state and assembles
// its root inside the call, and under TCG its VMM translates the guest's
// paths afresh; a ready VM has done all of it before the call: it is
// restored from its shape's snapshot with its disks backed (the base, a
// stage chain's layers and a fresh scratch disk), has assembled its root
// and run a warm-up command that writes nothing, and runs on with idle
// vCPUs. A claim does only what makes it the run's own (fresh entropy,
// clock, hostname, network, a boot id of its own), then the command.
//
// A shape is hot once a run of it resumed from a snapshot; the pool keeps
// its count of ready VMs for each of the most recently used shapes and
// refills after each claim, in the background. A ready VM older than
// readyMaxAge, or made from a snapshot that has since been replaced, is
// discarded, not used. The core decides what a
// shape is and makes its VMs (Spec.Make); the pool keeps, hands out and
// ends them.

const (
	// readyMaxAge is how long a ready VM waits for a claim.
	readyMaxAge = 10 * time.Minute
	// readyMaxShapes caps the hot shapes kept ready.
	readyMaxShapes = 4
	// readyFillTimeout bounds making one ready VM.
	readyFillTimeout = 2 * time.Minute
)

// Shape is what a ready VM is made for.
type Shape struct {
	Key        string // the warm key: base build, sizes, NIC, kernel, VMM
	Layers     string // the chain's layer files, root first
	ScratchMiB int
}

// ReadySpec is what making a ready VM of a shape needs.
type ReadySpec struct {
	Shape  Shape
	Layers []string // the layer files, root first
	MemMiB int      // the guest memory, for its place
	// Make restores a VM of the shape and readies it, in place (which a
	// failure releases).
	Make func(ctx context.Context, place *admission.Ticket) (*Ready, error)
}

// HoldFunc waits for a place for a background VM of memMiB; y asks it
// back. A nil ticket is no limit.
type HoldFunc func(ctx context.Context, memMiB int, y admission.Yield) (*admission.Ticket, error)

// readySlot is one fill's ready VM, for a call that takes its place.
type readySlot struct {
	cancel context.CancelFunc // ends the making
	rv     *Ready             // once made and in the pool; guarded by Pool.mu
}

// Pool holds a long-lived front end's ready VMs. A nil Pool holds none.
type Pool struct {
	log  *slog.Logger
	per  int
	hold HoldFunc

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // fills

	mu      sync.Mutex // guards following
	vms     map[Shape][]*Ready
	hot     []ReadySpec // most recent first
	filling map[Shape]int
	closed  bool
}

// NewPool makes a pool that keeps per ready VMs of each hot shape, each
// made once hold gives it a place.
func NewPool(log *slog.Logger, per int, hold HoldFunc) *Pool {
	ctx, cancel := context.WithCancel(context.Background())
	return &Pool{log: log, per: per, hold: hold, ctx: ctx, cancel: cancel,
		vms: map[Shape][]*Ready{}, filling: map[Shape]int{}}
}

// Claim takes a ready VM of sp's shape made from the snapshot build
// buildID, marking the shape hot; nil when there is none. Stale and old
// ones met on the way are discarded.
func (p *Pool) Claim(sp ReadySpec, buildID string) *Ready {
	if p == nil || p.per <= 0 {
		return nil
	}
	p.mu.Lock()
	p.markHot(sp)
	var got *Ready
	var stale []*Ready
	list := p.vms[sp.Shape]
	for len(list) > 0 && got == nil {
		rv := list[0]
		list = list[1:]
		if rv.BuildID != buildID || time.Since(rv.Made) > readyMaxAge || rv.exited() || !rv.layersCurrent() {
			stale = append(stale, rv)
			continue
		}
		got = rv
	}
	p.vms[sp.Shape] = list
	p.mu.Unlock()
	for _, rv := range stale {
		rv.Discard()
	}
	return got
}

// markHot puts sp first among the hot shapes, dropping the least recent
// beyond readyMaxShapes (their ready VMs are discarded by refill).
//
// Preconditions: p.mu is held.
func (p *Pool) markHot(sp ReadySpec) {
	out := []ReadySpec{sp}
	for _, h := range p.hot {
		if h.Shape != sp.Shape && len(out) < readyMaxShapes {
			out = append(out, h)
		}
	}
	p.hot = out
}

// NoteHot marks sp's shape hot and refills.
func (p *Pool) NoteHot(sp ReadySpec) {
	if p == nil || p.per <= 0 {
		return
	}
	p.mu.Lock()
	p.markHot(sp)
	p.mu.Unlock()
	p.Refill()
}

// Refill starts making ready VMs, in the background, for every hot shape
// short of its count, and discards those of shapes no longer hot.
func (p *Pool) Refill() {
	if p == nil || p.per <= 0 {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	var cold []*Ready
	// A shape whose stage was removed is not kept ready: its ready VMs
	// would hold the removed layers, and no run can claim them.
	live := p.hot[:0]
	for _, sp := range p.hot {
		if layersExist(sp.Layers) {
			live = append(live, sp)
		}
	}
	p.hot = live
	hot := map[Shape]bool{}
	for _, sp := range p.hot {
		hot[sp.Shape] = true
		kept := p.vms[sp.Shape][:0]
		for _, rv := range p.vms[sp.Shape] {
			if rv.layersCurrent() {
				kept = append(kept, rv)
			} else {
				cold = append(cold, rv)
			}
		}
		p.vms[sp.Shape] = kept
		for n := len(p.vms[sp.Shape]) + p.filling[sp.Shape]; n < p.per; n++ {
			p.filling[sp.Shape]++
			p.wg.Add(1)
			go p.fill(sp)
		}
	}
	for sh, list := range p.vms {
		if !hot[sh] {
			cold = append(cold, list...)
			delete(p.vms, sh)
		}
	}
	p.mu.Unlock()
	for _, rv := range cold {
		rv.Discard()
	}
}

// fill makes one ready VM of sp, once it has a place (it waits for one
// without a bound: close ends the wait), and adds it to the pool. The
// place is lendable once the VM waits in the pool.
func (p *Pool) fill(sp ReadySpec) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	slot := &readySlot{cancel: cancel}
	place, err := p.hold(ctx, sp.MemMiB, admission.Yield{End: func() { p.yield(slot) }, Kind: ledger.KindReady})
	var rv *Ready
	if err == nil {
		mctx, cancelMake := context.WithTimeout(ctx, readyFillTimeout)
		rv, err = sp.Make(mctx, place)
		cancelMake()
	}
	p.mu.Lock()
	p.filling[sp.Shape]--
	// A call that took the place while the VM was made ended ctx.
	keep := err == nil && !p.closed && ctx.Err() == nil
	if keep {
		p.vms[sp.Shape] = append(p.vms[sp.Shape], rv)
		slot.rv = rv
	}
	p.mu.Unlock()
	switch {
	case err != nil:
		place.Release()
		if ctx.Err() == nil {
			p.log.Warn("ready VM: not made", "shape", sp.Shape.Key, "err", err)
		}
	case !keep:
		rv.Discard()
	default:
		place.AllowLend()
		return
	}
	if ctx.Err() != nil && p.ctx.Err() == nil {
		p.Refill() // a call took the place: again once one is free
	}
}

// yield ends the ready VM of slot (or its making) for a call that needs
// its place, to be made again once a place is free; a VM claimed
// meanwhile took its place with it.
func (p *Pool) yield(slot *readySlot) {
	slot.cancel()
	p.mu.Lock()
	rv := slot.rv
	slot.rv = nil
	if p.closed || rv == nil || !p.removeLocked(rv) {
		p.mu.Unlock()
		return
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	rv.Discard()
	p.Refill() // again once a place is free
}

// Settle ends the ready VMs whose places were lent to the call that holds
// place and that its run did not claim: the run's own VM starts in their
// place. They are made again once a place is free.
func (p *Pool) Settle(place *admission.Ticket) {
	if p == nil || place == nil {
		return
	}
	var lent []*Ready
	p.mu.Lock()
	for _, list := range p.vms {
		for _, rv := range list {
			if rv.Place.LentTo(place) {
				lent = append(lent, rv)
			}
		}
	}
	for _, rv := range lent {
		p.removeLocked(rv)
	}
	p.mu.Unlock()
	for _, rv := range lent {
		rv.Discard()
	}
	if len(lent) > 0 {
		p.Refill() // again once a place is free
	}
}

// GiveWay ends the ready VM of the least recently used shape that has
// one, for a snapshot build that needs its place; it is made again once a
// place is free.
func (p *Pool) GiveWay() {
	if p == nil {
		return
	}
	p.mu.Lock()
	var rv *Ready
	for i := len(p.hot) - 1; i >= 0 && rv == nil; i-- {
		if list := p.vms[p.hot[i].Shape]; len(list) > 0 {
			rv = list[len(list)-1]
			p.removeLocked(rv)
		}
	}
	p.mu.Unlock()
	if rv != nil {
		rv.Discard()
		p.Refill()
	}
}

// removeLocked takes rv out of the pool; false when it is not there.
//
// Preconditions: p.mu is held.
func (p *Pool) removeLocked(rv *Ready) bool {
	list := p.vms[rv.Shape]
	i := slices.Index(list, rv)
	if i < 0 {
		return false
	}
	p.vms[rv.Shape] = slices.Delete(list, i, i+1)
	return true
}

// Close discards every ready VM and waits for fills under way. Idempotent.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	var all []*Ready
	for _, list := range p.vms {
		all = append(all, list...)
	}
	p.vms = map[Shape][]*Ready{}
	p.mu.Unlock()
	p.cancel()
	for _, rv := range all {
		rv.Discard()
	}
	p.wg.Wait()
}
