package machine_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/machine"
	"isopod/internal/vmm/vmmfake"
)

// poolFixture makes ready VMs of fake machines and records them.
type poolFixture struct {
	t      *testing.T
	drv    *vmmfake.Driver
	mu     sync.Mutex
	made   []*machine.Ready
	yields []admission.Yield
}

func newPoolFixture(t *testing.T) *poolFixture {
	t.Helper()
	drv, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	f := &poolFixture{t: t, drv: drv}
	t.Cleanup(func() {
		for _, fm := range drv.Machines() {
			select {
			case <-fm.Done():
			default:
				t.Errorf("machine %s still runs after the pool closed", fm.Config().ID)
				fm.Kill()
			}
		}
	})
	return f
}

// spec is a ready spec of the shape key over layers, whose VMs are made
// from the snapshot build b1.
func (f *poolFixture) spec(key string, layers ...string) machine.ReadySpec {
	cfg := fakeConfig(f.t)
	sh := machine.Shape{Key: key, ScratchMiB: 64}
	for _, l := range layers {
		sh.Layers += l + ";"
	}
	return machine.ReadySpec{Shape: sh, Layers: layers, MemMiB: 128,
		Make: func(ctx context.Context, place *admission.Ticket) (*machine.Ready, error) {
			rv := &machine.Ready{Shape: sh, BuildID: "b1", Made: time.Now(), Dir: &readyDir{path: cfg.Dir}, VM: machine.New(nil), Place: place}
			if err := rv.NoteLayers(layers); err != nil {
				return nil, err
			}
			if err := rv.VM.Boot(ctx, f.drv, cfg); err != nil {
				return nil, err
			}
			f.mu.Lock()
			f.made = append(f.made, rv)
			f.mu.Unlock()
			return rv, nil
		}}
}

func (f *poolFixture) hold(_ context.Context, _ int, y admission.Yield) (*admission.Ticket, error) {
	f.mu.Lock()
	f.yields = append(f.yields, y)
	f.mu.Unlock()
	return nil, nil
}

// count is how many ready VMs were made, and how many of them discarded.
func (f *poolFixture) count() (made, discarded int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, rv := range f.made {
		if rv.Dir.(*readyDir).finished.Load() {
			discarded++
		}
	}
	return len(f.made), discarded
}

func (f *poolFixture) pool(per int) *machine.Pool {
	p := machine.NewPool(slog.New(slog.DiscardHandler), per, f.hold)
	f.t.Cleanup(p.Close)
	return p
}

// TestPoolStaleLayers: a ready VM whose layer file was replaced since it
// was made is discarded by a claim, not handed out; a shape whose layer
// is gone is no longer kept ready.
func TestPoolStaleLayers(t *testing.T) {
	f := newPoolFixture(t)
	layer := filepath.Join(t.TempDir(), "layer.img")
	os.WriteFile(layer, []byte("v1"), 0o600)
	sp := f.spec("k", layer)
	p := f.pool(1)
	p.NoteHot(sp)
	waitTrue(t, "the first ready VM", func() bool { m, _ := f.count(); return m == 1 })

	os.Remove(layer)
	os.WriteFile(layer, []byte("v2, pulled again"), 0o600)
	waitTrue(t, "a claim over a replaced layer", func() bool {
		if rv := p.Claim(sp, "b1"); rv != nil {
			rv.Discard()
			if rv == f.made[0] {
				t.Fatal("a ready VM made over a replaced layer was handed out")
			}
			return true
		}
		_, d := f.count()
		return d >= 1
	})
	if _, d := f.count(); d < 1 {
		t.Errorf("the stale ready VM was not discarded")
	}

	p.Refill()
	waitTrue(t, "the refill over the new layer", func() bool { m, _ := f.count(); return m >= 2 })
	os.Remove(layer)
	// A VM whose making ends after a refill is discarded by the next one.
	waitTrue(t, "every ready VM discarded once the layer is gone", func() bool { p.Refill(); m, d := f.count(); return m == d })
	p.Refill()
	if m, _ := f.count(); m != 2 {
		t.Errorf("%d ready VMs made for a shape whose layer is gone; want none after the first two", m-2)
	}
	if rv := p.Claim(sp, "b1"); rv != nil {
		t.Errorf("a ready VM handed out over a missing layer")
	}
}

// TestPoolGiveWay: GiveWay ends the ready VM of the least recently used
// shape, and the pool makes it again.
func TestPoolGiveWay(t *testing.T) {
	f := newPoolFixture(t)
	old, recent := f.spec("old"), f.spec("recent")
	p := f.pool(1)
	p.NoteHot(old)
	waitTrue(t, "a ready VM of the old shape", func() bool { m, _ := f.count(); return m == 1 })
	p.NoteHot(recent)
	waitTrue(t, "a ready VM of each shape", func() bool { m, _ := f.count(); return m == 2 })
	p.GiveWay()
	f.mu.Lock()
	var gone *machine.Ready
	for _, rv := range f.made {
		if rv.Dir.(*readyDir).finished.Load() {
			gone = rv
		}
	}
	f.mu.Unlock()
	if gone == nil || gone.Shape.Key != "old" {
		t.Fatalf("GiveWay ended %v; want the ready VM of the least recent shape", gone)
	}
	waitTrue(t, "the refill after GiveWay", func() bool { m, _ := f.count(); return m == 3 })
	var rv *machine.Ready
	waitTrue(t, "a claim of the recent shape", func() bool { rv = p.Claim(recent, "b1"); return rv != nil })
	defer rv.Discard()
	if rv.Shape.Key != "recent" || rv.Dir.(*readyDir).finished.Load() {
		t.Errorf("claim of the recent shape got one of %q, ended %v", rv.Shape.Key, rv.Dir.(*readyDir).finished.Load())
	}
}

// TestPoolYield: a ready VM whose place is asked back is ended and made
// again; after Close nothing is made and every ready VM is ended.
func TestPoolYield(t *testing.T) {
	f := newPoolFixture(t)
	sp := f.spec("k")
	p := f.pool(1)
	p.NoteHot(sp)
	waitTrue(t, "the first ready VM", func() bool { m, _ := f.count(); return m == 1 })
	f.mu.Lock()
	y := f.yields[0]
	f.mu.Unlock()
	y.End()
	waitTrue(t, "the yielded ready VM ended", func() bool { _, d := f.count(); return d == 1 })
	waitTrue(t, "the VM made again", func() bool { m, _ := f.count(); return m == 2 })
	y.End() // its VM is gone already: nothing more to end
	if m, d := f.count(); m != 2 || d != 1 {
		t.Errorf("a second yield of an ended slot: %d made, %d ended; want 2, 1", m, d)
	}
	p.Close()
	p.Close()
	if m, d := f.count(); m != d {
		t.Errorf("after Close: %d made, %d ended", m, d)
	}
	p.Refill()
	p.NoteHot(sp)
	if m, _ := f.count(); m != 2 {
		t.Errorf("a closed pool made a ready VM")
	}
	if rv := p.Claim(sp, "b1"); rv != nil {
		t.Errorf("a closed pool handed out a ready VM")
	}
}

// TestPoolSettle: a ready VM whose place was lent to a waiting call is
// ended by Settle for that call (its run claimed none), and is made again
// once the call's place is free.
func TestPoolSettle(t *testing.T) {
	f := newPoolFixture(t)
	adm, err := admission.New(admission.Config{MaxVMs: 1, Queue: 1, MemoryBudgetMiB: 4096})
	if err != nil {
		t.Fatal(err)
	}
	hold := func(ctx context.Context, mem int, y admission.Yield) (*admission.Ticket, error) {
		for {
			if tk, ok := adm.TryHold(mem, y); ok {
				return tk, nil
			}
			select {
			case <-adm.Freed():
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
	}
	p := machine.NewPool(slog.New(slog.DiscardHandler), 1, hold)
	t.Cleanup(p.Close)
	sp := f.spec("k")
	p.NoteHot(sp)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var lent *machine.Ready
	// A call that comes while the ready VM is still being made has it
	// ended instead of lent; it is then made again, and the call tries again.
	for try := 0; lent == nil; try++ {
		if try == 10 {
			t.Fatal("no ready VM's place was lent in 10 tries")
		}
		made, _ := f.count()
		waitTrue(t, "a ready VM", func() bool { m, d := f.count(); return m > made-1 && m > d })
		call, err := adm.Reserve(128)
		if err != nil {
			t.Fatal(err)
		}
		if err := call.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		f.mu.Lock()
		for _, rv := range f.made {
			if rv.Place.LentTo(call) {
				lent = rv
			}
		}
		f.mu.Unlock()
		if lent == nil {
			call.Release()
			continue
		}
		p.Settle(call)
		if !lent.Dir.(*readyDir).finished.Load() {
			t.Error("Settle left the lent ready VM")
		}
		m, _ := f.count()
		call.Release()
		waitTrue(t, "the ready VM made again", func() bool { n, _ := f.count(); return n == m+1 })
	}
	p.Settle(nil)
}
