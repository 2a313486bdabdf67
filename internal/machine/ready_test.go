package machine_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/machine"
	"isopod/internal/vmm/vmmfake"
)

// readyDir is a ready VM's directory for the pool's tests.
type readyDir struct {
	path     string
	finished atomic.Bool
}

func (d *readyDir) Path() string { return d.path }
func (d *readyDir) Finish()      { d.finished.Store(true) }

// waitTrue waits, with a bound, for cond.
func waitTrue(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(end) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestPoolClaim: a shape that turns hot gets a ready VM made in the
// background; a claim of its snapshot build takes it, the refill makes
// another, and a claim of another build ends that one instead of taking it.
func TestPoolClaim(t *testing.T) {
	vms := make(chan *machine.Machine, 2)
	for range 2 {
		m, _ := bootFake(t, vmmfake.Config{})
		vms <- m
	}
	dirs, base := make(chan *readyDir, 2), t.TempDir()
	sh := machine.Shape{Key: "k", ScratchMiB: 64}
	sp := machine.ReadySpec{Shape: sh, MemMiB: 128,
		Make: func(ctx context.Context, place *admission.Ticket) (*machine.Ready, error) {
			d := &readyDir{path: base}
			dirs <- d
			return &machine.Ready{Shape: sh, BuildID: "b1", Made: time.Now(), Dir: d, VM: <-vms, Place: place}, nil
		}}
	hold := func(context.Context, int, admission.Yield) (*admission.Ticket, error) { return nil, nil }
	p := machine.NewPool(slog.New(slog.DiscardHandler), 1, hold)
	t.Cleanup(p.Close)

	if rv := p.Claim(sp, "b1"); rv != nil {
		t.Fatalf("a claim before any fill got a ready VM")
	}
	p.NoteHot(sp)
	var rv *machine.Ready
	waitTrue(t, "the first ready VM", func() bool { rv = p.Claim(sp, "b1"); return rv != nil })
	defer rv.Discard()
	first := <-dirs
	if rv.Dir != first || first.finished.Load() {
		t.Errorf("claimed VM: dir %p finished %v; want the first made, not finished", rv.Dir, first.finished.Load())
	}
	p.NoteHot(sp)
	second := <-dirs
	waitTrue(t, "a claim of another build ending the refill's VM", func() bool {
		if got := p.Claim(sp, "b2"); got != nil {
			t.Fatalf("a claim of another build got a ready VM")
		}
		return second.finished.Load()
	})
}

// TestNilPool: a nil Pool holds no ready VM and does nothing.
func TestNilPool(t *testing.T) {
	var p *machine.Pool
	if p.Claim(machine.ReadySpec{}, "b") != nil {
		t.Error("a nil pool handed out a ready VM")
	}
	p.NoteHot(machine.ReadySpec{})
	p.Refill()
	p.Settle(nil)
	p.GiveWay()
	p.Close()
}
