package sandbox_test

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// A long-lived front end's Service under its admission: ready VMs and
// background snapshot builds take places only when they are free, and
// give them to calls at once.

// newAdmission is a front end's admission of maxVMs places and a queue of
// queue, with memory to spare, for the core's sizes of VMs.
func newAdmission(t *testing.T, maxVMs, queue int) *admission.Admission {
	t.Helper()
	a, err := admission.New(admission.Config{MaxVMs: maxVMs, Queue: queue, MemoryBudgetMiB: 100000,
		OverheadMiB: 256, MinMemMiB: sandbox.MinMemMiB, RunMemMiB: sandbox.DefaultMemMiB})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// placeHost is a Service whose background VMs take their places from a,
// and which counts the most machines that ever ran at once.
type placeHost struct {
	a       *admission.Admission
	s       *sandbox.Service
	d       *vmmfake.Driver
	maxLive atomic.Int32
}

// newPlaceHost makes a host of maxVMs places with ready VMs and
// background snapshot builds, its machines as cfg makes them.
func newPlaceHost(t *testing.T, maxVMs int, cfg vmmfake.Config) *placeHost {
	t.Helper()
	h := &placeHost{a: newAdmission(t, maxVMs, 4)}
	var drv atomic.Pointer[vmmfake.Driver]
	count := func() {
		n := int32(1) // the machine about to start
		for _, m := range drv.Load().Machines() {
			select {
			case <-m.Done():
			default:
				n++
			}
		}
		for {
			old := h.maxLive.Load()
			if n <= old || h.maxLive.CompareAndSwap(old, n) {
				return
			}
		}
	}
	cfg.FailStart = func(vmm.Config) error { count(); return nil }
	cfg.FailRestore = func(vmm.Config, string) error { count(); return nil }
	h.s, h.d = newFakeWith(t, cfg, func(o *sandbox.Options) {
		o.ReadyVMs, o.BackgroundSnapshots, o.Places = 1, true, h.a
	})
	drv.Store(h.d)
	// As in the MCP server: a VM's last teardown comes after its report.
	h.s.TeardownInBackground()
	t.Cleanup(func() {
		h.s.Wait()
		if n := h.maxLive.Load(); n > int32(maxVMs) {
			t.Errorf("%d machines ran at once on a host of %d places", n, maxVMs)
		}
	})
	return h
}

// call runs req as the MCP server does: a place first (waited for a few
// seconds at most: a call never waits for a background VM), then the run
// in it.
func (h *placeHost) call(t *testing.T, what string, req sandbox.Request) *report.Run {
	t.Helper()
	tk, err := h.a.Reserve(512)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return nil
	}
	defer tk.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := tk.Wait(ctx); err != nil {
		t.Errorf("%s: no place within 5 s: %v (%+v)", what, err, h.a.Stats())
		return nil
	}
	req.Place = tk
	rep, err := runErr(t, h.s, req)
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return nil
	}
	return rep
}

// waitReady waits for a ready VM that waits in the pool, its place
// lendable.
func (h *placeHost) waitReady(t *testing.T) {
	t.Helper()
	waitFor(t, "a ready VM", func() bool { return readyIn(h.a, h.d) == 1 })
}

// otherScratch is a scratch size other than the default: a shape of it
// keeps to the plain snapshot and never gets an assembled one.
const otherScratch = 256

func (h *placeHost) snapshots() int {
	l, err := h.s.WarmList(context.Background())
	if err != nil {
		return -1
	}
	n := 0
	for _, e := range l.Snapshots {
		if !e.RootAssembled { // a recurring shape's comes besides
			n++
		}
	}
	return n
}

// isBuilder reports whether cfg is a snapshot VM's.
func isBuilder(cfg vmm.Config) bool { return strings.Contains(cfg.Cmdline, "=isopod-warm") }

// On a host of one place, background work happens between calls and gives
// way to every call: the snapshot is built after the first call, a ready
// VM made after the second, the third takes it at once (its place is lent
// to the call, which claims it), and a call of another shape has the
// ready VM ended for its own.
func TestOnePlaceCallsTakeReadyVMs(t *testing.T) {
	t.Parallel()
	h := newPlaceHost(t, 1, vmmfake.Config{})
	if rep := h.call(t, "first call", sandbox.Request{Argv: []string{"true"}}); rep != nil && rep.Path != "cold" {
		t.Errorf("first call: path %q; want cold", rep.Path)
	}
	waitFor(t, "the snapshot built after the first call", func() bool { return h.snapshots() == 1 })
	if rep := h.call(t, "second call", sandbox.Request{Argv: []string{"true"}}); rep != nil && (rep.Path != "warm" || rep.ReadyVM) {
		t.Errorf("second call: path %q ready %v; want a plain resume", rep.Path, rep.ReadyVM)
	}
	for i := range 2 {
		h.waitReady(t)
		if rep := h.call(t, "ready call", sandbox.Request{Argv: []string{"true"}}); rep != nil && !rep.ReadyVM {
			t.Errorf("ready call %d: path %q; want the ready VM", i, rep.Path)
		}
	}
	h.waitReady(t)
	other := sandbox.Request{Argv: []string{"echo", "other"}, NoNetwork: true}
	if rep := h.call(t, "a call of another shape", other); rep != nil && (rep.Path != "cold" || rep.Stdout != "other\n") {
		t.Errorf("a call of another shape: path %q stdout %q; want a cold boot", rep.Path, rep.Stdout)
	}
	waitFor(t, "the other shape's snapshot", func() bool { return h.snapshots() == 2 })
	if rep := h.call(t, "another call of the other shape", other); rep != nil && rep.Path != "warm" {
		t.Errorf("another call of the other shape: path %q; want warm", rep.Path)
	}
}

// A call ends a background snapshot build that holds the only place (here
// one whose guest never boots); the build is tried again after the call,
// and succeeds. (Another scratch size: the shape gets no assembled
// snapshot, whose build would come besides.)
func TestOnePlaceCallEndsABuild(t *testing.T) {
	t.Parallel()
	var builders atomic.Int32
	h := newPlaceHost(t, 1, vmmfake.Config{Hang: func(cfg vmm.Config) bool { return isBuilder(cfg) && builders.Add(1) == 1 }})
	h.call(t, "first call", sandbox.Request{Argv: []string{"true"}, ScratchMiB: otherScratch})
	var builder *vmmfake.Machine
	waitFor(t, "the snapshot build after the first call", func() bool {
		for _, m := range h.d.Machines() {
			if isBuilder(m.Config()) {
				builder = m
				return true
			}
		}
		return false
	})
	t0 := time.Now()
	rep := h.call(t, "second call", sandbox.Request{Argv: []string{"echo", "two"}, ScratchMiB: otherScratch})
	if rep != nil && (rep.Path != "cold" || rep.Stdout != "two\n") {
		t.Errorf("second call: path %q stdout %q; want a cold boot", rep.Path, rep.Stdout)
	}
	t.Logf("second call answered in %v", time.Since(t0))
	select {
	case <-builder.Done():
	default:
		t.Error("the build that gave way still runs")
	}
	waitFor(t, "the build tried again after the call", func() bool { return h.snapshots() == 1 })
	if n := builders.Load(); n != 2 {
		t.Errorf("%d snapshot VMs started; want 2 (the one that gave way, the retry)", n)
	}
}

// On a host of two places, a ready VM does not make two concurrent calls
// take turns: each command waits for the other's to start.
func TestTwoPlacesReadyVMConcurrentCalls(t *testing.T) {
	t.Parallel()
	h := newPlaceHost(t, 2, vmmfake.Config{})
	h.call(t, "first call", sandbox.Request{Argv: []string{"true"}})
	waitFor(t, "the snapshot", func() bool { return h.snapshots() == 1 })
	h.call(t, "second call", sandbox.Request{Argv: []string{"true"}})
	h.waitReady(t)
	dir := t.TempDir()
	meet := func(mine, theirs string) []string {
		return []string{"sh", "-c", "touch " + filepath.Join(dir, mine) + "; while [ ! -e " + filepath.Join(dir, theirs) + " ]; do sleep 0.02; done"}
	}
	for _, network := range []bool{true, false} { // the ready VM's shape, and another
		var wg sync.WaitGroup
		for i, pair := range [][2]string{{"a", "b"}, {"b", "a"}} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pfx := map[bool]string{true: "net-", false: "nonet-"}[network]
				req := sandbox.Request{Argv: meet(pfx+pair[0], pfx+pair[1]), TimeoutS: 10, NoNetwork: !network}
				rep := h.call(t, "concurrent call", req)
				if rep != nil && (rep.TimedOut || code(rep) != 0) {
					t.Errorf("concurrent call %d (network %v): timed out %v exit %d; want both commands to meet", i, network, rep.TimedOut, code(rep))
				}
			}()
		}
		wg.Wait()
		h.waitReady(t)
	}
}

// A snapshot build comes before ready VMs: on a host of two places, where
// a ready VM holds the one place background VMs may have, a call of
// another shape runs beside it, and its snapshot build ends the ready VM
// to take its place; the ready VM is made again after the build.
func TestBuildTakesAReadyVMsPlace(t *testing.T) {
	t.Parallel()
	h := newPlaceHost(t, 2, vmmfake.Config{})
	h.call(t, "first call", sandbox.Request{Argv: []string{"true"}})
	waitFor(t, "the snapshot", func() bool { return h.snapshots() == 1 })
	h.call(t, "second call", sandbox.Request{Argv: []string{"true"}})
	h.waitReady(t)
	if rep := h.call(t, "a call of another shape", sandbox.Request{Argv: []string{"true"}, NoNetwork: true}); rep != nil && rep.Path != "cold" {
		t.Errorf("a call of another shape: path %q; want cold", rep.Path)
	}
	waitFor(t, "the other shape's snapshot", func() bool { return h.snapshots() == 2 })
	h.waitReady(t)
}

// A call's place is free only once its VM is gone: with the last of the
// teardown after the report, as in the MCP server, and VMMs that take a
// while to be reaped, calls one after another on a host of one place
// never have two VMMs at once, the ready VM's and the background build's
// included.
func TestAPlaceIsFreeOnceItsVMIsGone(t *testing.T) {
	t.Parallel()
	h := newPlaceHost(t, 1, vmmfake.Config{ReapDelay: 100 * time.Millisecond})
	for i := range 5 {
		if rep := h.call(t, fmt.Sprintf("call %d", i+1), sandbox.Request{Argv: []string{"true"}}); rep != nil && code(rep) != 0 {
			t.Errorf("call %d: exit %d", i+1, code(rep))
		}
	}
}
