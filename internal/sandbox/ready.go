package sandbox

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"isopod/internal/admission"
	"isopod/internal/machine"
	"isopod/internal/vmm"
)

// Ready VMs, for a front end that lives long (the MCP server). A warm run
// still starts its VMM and loads the snapshot's device state inside the
// call; a ready VM has done both before the call: it is restored from its
// shape's snapshot, paused (no guest code runs), with its disks already
// backed: the base, a stage chain's layers and a fresh scratch disk. A
// claim resumes it and does only what makes it the run's own, as after any
// resume: fresh entropy, clock, hostname, network, then the root and the
// command. Everything per-clone still happens after the resume.
//
// A shape is hot once a run of it resumed from a snapshot; the pool keeps
// Options.ReadyVMs ready VMs for each of the most recently used shapes and
// refills after each claim, in the background. A ready VM older than
// readyMaxAge, or made from a snapshot that has since been replaced, is
// discarded, not used. Runs with a workspace never use one (their disks
// are only known at the call).

const (
	// readyMaxAge is how long a ready VM waits for a claim.
	readyMaxAge = 10 * time.Minute
	// readyMaxShapes caps the hot shapes kept ready.
	readyMaxShapes = 4
	// readyFillTimeout bounds making one ready VM.
	readyFillTimeout = 2 * time.Minute
)

// readyShape is what a ready VM is made for.
type readyShape struct {
	key        string // the warm key: base build, sizes, NIC, kernel, VMM
	layers     string // the chain's layer files, root first
	scratchMiB int
}

// readySpec is what making a ready VM of a shape needs.
type readySpec struct {
	shape  readyShape
	in     warmInputs
	layers []string
	base   string // flavor, for the record
}

// readyVM is one restored, paused VM waiting for a claim.
type readyVM struct {
	shape   readyShape
	buildID string // the snapshot's build
	made    time.Time
	dir     *vmDir
	vm      *machine.Machine
	nic     *machine.NIC // nil without a NIC
	scratch string
	// layers are the stage layer files the VM was made with, as they were
	// then: a stage removed since (and maybe pulled again) must not serve
	// a run with the file it had.
	layerPaths []string
	layers     []os.FileInfo
	vmmInfo    vmm.Info
	// place is what the VM holds until a run claims it (nil: nothing).
	place *admission.Ticket
}

// readySlot is one fill's ready VM, for a call that takes its place.
type readySlot struct {
	cancel context.CancelFunc // ends the making
	rv     *readyVM           // once made and in the pool; guarded by readyPool.mu
}

// readyPool holds the ready VMs of a Service.
type readyPool struct {
	s   *Service
	per int

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup // fills

	mu      sync.Mutex // guards following
	vms     map[readyShape][]*readyVM
	hot     []readySpec // most recent first
	filling map[readyShape]int
	closed  bool
}

func newReadyPool(s *Service, per int) *readyPool {
	ctx, cancel := context.WithCancel(context.Background())
	return &readyPool{s: s, per: per, ctx: ctx, cancel: cancel,
		vms: map[readyShape][]*readyVM{}, filling: map[readyShape]int{}}
}

// readySpecFor is the shape a run would claim, ok false when it cannot
// use a ready VM.
func (r *run) readySpecFor() (readySpec, bool) {
	if r.warm == nil || r.req.Workspace != nil {
		return readySpec{}, false
	}
	sh := readyShape{key: r.warm.in.key.ID(), layers: strings.Join(r.plan.layers, "\x00"), scratchMiB: r.plan.scratchMiB}
	return readySpec{shape: sh, in: r.warm.in, layers: r.plan.layers, base: r.plan.base.Flavor}, true
}

// claim takes a ready VM of sp's shape made from the snapshot build
// buildID, marking the shape hot; nil when there is none. Stale and old
// ones met on the way are discarded.
func (p *readyPool) claim(sp readySpec, buildID string) *readyVM {
	if p == nil || p.per <= 0 {
		return nil
	}
	p.mu.Lock()
	p.markHot(sp)
	var got *readyVM
	var stale []*readyVM
	list := p.vms[sp.shape]
	for len(list) > 0 && got == nil {
		rv := list[0]
		list = list[1:]
		if rv.buildID != buildID || time.Since(rv.made) > readyMaxAge || rv.exited() || !rv.layersCurrent() {
			stale = append(stale, rv)
			continue
		}
		got = rv
	}
	p.vms[sp.shape] = list
	p.mu.Unlock()
	for _, rv := range stale {
		rv.discard()
	}
	return got
}

// markHot puts sp first among the hot shapes, dropping the least recent
// beyond readyMaxShapes (their ready VMs are discarded by refill).
//
// Preconditions: p.mu is held.
func (p *readyPool) markHot(sp readySpec) {
	out := []readySpec{sp}
	for _, h := range p.hot {
		if h.shape != sp.shape && len(out) < readyMaxShapes {
			out = append(out, h)
		}
	}
	p.hot = out
}

// noteHot marks sp's shape hot and refills.
func (p *readyPool) noteHot(sp readySpec) {
	if p == nil || p.per <= 0 {
		return
	}
	p.mu.Lock()
	p.markHot(sp)
	p.mu.Unlock()
	p.refill()
}

// refill starts making ready VMs, in the background, for every hot shape
// short of its count, and discards those of shapes no longer hot.
func (p *readyPool) refill() {
	if p == nil || p.per <= 0 {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	var cold []*readyVM
	// A shape whose stage was removed is not kept ready: its ready VMs
	// would hold the removed layers, and no run can claim them.
	live := p.hot[:0]
	for _, sp := range p.hot {
		if layersExist(sp.layers) {
			live = append(live, sp)
		}
	}
	p.hot = live
	hot := map[readyShape]bool{}
	for _, sp := range p.hot {
		hot[sp.shape] = true
		kept := p.vms[sp.shape][:0]
		for _, rv := range p.vms[sp.shape] {
			if rv.layersCurrent() {
				kept = append(kept, rv)
			} else {
				cold = append(cold, rv)
			}
		}
		p.vms[sp.shape] = kept
		for n := len(p.vms[sp.shape]) + p.filling[sp.shape]; n < p.per; n++ {
			p.filling[sp.shape]++
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
		rv.discard()
	}
}

// fill makes one ready VM of sp, once it has a place (it waits for one
// without a bound: close ends the wait), and adds it to the pool. The
// place is lendable once the VM waits in the pool.
func (p *readyPool) fill(sp readySpec) {
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(p.ctx)
	defer cancel()
	slot := &readySlot{cancel: cancel}
	place, err := p.s.holdVM(ctx, sp.in.key.MemMiB, admission.Yield{End: func() { p.yield(slot) }}, false)
	var rv *readyVM
	if err == nil {
		mctx, cancelMake := context.WithTimeout(ctx, readyFillTimeout)
		rv, err = p.s.makeReady(mctx, sp, place)
		cancelMake()
	}
	p.mu.Lock()
	p.filling[sp.shape]--
	// A call that took the place while the VM was made ended ctx.
	keep := err == nil && !p.closed && ctx.Err() == nil
	if keep {
		p.vms[sp.shape] = append(p.vms[sp.shape], rv)
		slot.rv = rv
	}
	p.mu.Unlock()
	switch {
	case err != nil:
		place.Release()
		if ctx.Err() == nil {
			p.s.log.Warn("ready VM: not made", "shape", sp.shape.key, "err", err)
		}
	case !keep:
		rv.discard()
	default:
		place.AllowLend()
		return
	}
	if ctx.Err() != nil && p.ctx.Err() == nil {
		p.refill() // a call took the place: again once one is free
	}
}

// yield ends the ready VM of slot (or its making) for a call that needs
// its place, to be made again once a place is free; a VM claimed
// meanwhile took its place with it.
func (p *readyPool) yield(slot *readySlot) {
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
	rv.discard()
	p.refill() // again once a place is free
}

// settle ends the ready VMs whose places were lent to the call that holds
// place and that its run did not claim: the run's own VM starts in their
// place. They are made again once a place is free.
func (p *readyPool) settle(place *admission.Ticket) {
	if p == nil || place == nil {
		return
	}
	var lent []*readyVM
	p.mu.Lock()
	for _, list := range p.vms {
		for _, rv := range list {
			if rv.place.LentTo(place) {
				lent = append(lent, rv)
			}
		}
	}
	for _, rv := range lent {
		p.removeLocked(rv)
	}
	p.mu.Unlock()
	for _, rv := range lent {
		rv.discard()
	}
	if len(lent) > 0 {
		p.refill() // again once a place is free
	}
}

// giveWay ends the ready VM of the least recently used shape that has
// one, for a snapshot build that needs its place; it is made again once a
// place is free.
func (p *readyPool) giveWay() {
	if p == nil {
		return
	}
	p.mu.Lock()
	var rv *readyVM
	for i := len(p.hot) - 1; i >= 0 && rv == nil; i-- {
		if list := p.vms[p.hot[i].shape]; len(list) > 0 {
			rv = list[len(list)-1]
			p.removeLocked(rv)
		}
	}
	p.mu.Unlock()
	if rv != nil {
		rv.discard()
		p.refill()
	}
}

// removeLocked takes rv out of the pool; false when it is not there.
//
// Preconditions: p.mu is held.
func (p *readyPool) removeLocked(rv *readyVM) bool {
	list := p.vms[rv.shape]
	i := slices.Index(list, rv)
	if i < 0 {
		return false
	}
	p.vms[rv.shape] = slices.Delete(list, i, i+1)
	return true
}

// close discards every ready VM and waits for fills under way. Idempotent.
func (p *readyPool) close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.closed = true
	var all []*readyVM
	for _, list := range p.vms {
		all = append(all, list...)
	}
	p.vms = map[readyShape][]*readyVM{}
	p.mu.Unlock()
	p.cancel()
	for _, rv := range all {
		rv.discard()
	}
	p.wg.Wait()
}

// exited reports whether the ready VM's VMM is gone.
func (rv *readyVM) exited() bool {
	m, _ := rv.vm.Current()
	if m == nil {
		return true
	}
	select {
	case <-m.Done():
		return true
	default:
		return false
	}
}

// layersCurrent reports whether each layer file the ready VM was made
// with is still the file at its path.
func (rv *readyVM) layersCurrent() bool {
	for i, fi := range rv.layers {
		now, err := os.Stat(rv.layerPaths[i])
		if err != nil || !sameFile(fi, now) {
			return false
		}
	}
	return true
}

// sameFile reports whether a and b describe one file, unchanged: the same
// inode and change time (an inode number alone may be reused once the
// file is gone).
func sameFile(a, b os.FileInfo) bool {
	sa, okA := a.Sys().(*syscall.Stat_t)
	sb, okB := b.Sys().(*syscall.Stat_t)
	return os.SameFile(a, b) && okA && okB && sa.Ctim == sb.Ctim && a.Size() == b.Size()
}

// layersExist reports whether every layer file is there.
func layersExist(layers []string) bool {
	for _, l := range layers {
		if _, err := os.Stat(l); err != nil {
			return false
		}
	}
	return true
}

// discard ends a ready VM that no run took: its VMM, its socket, its
// scratch disk and placeholders; its record is finished.
func (rv *readyVM) discard() {
	rv.vm.Close()
	if rv.nic != nil {
		rv.nic.Close()
	}
	cleanDisks(rv.dir.path, rv.scratch)
	rv.dir.finish(nil)
	rv.place.Release()
}
