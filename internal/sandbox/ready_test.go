package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/admission"
	"isopod/internal/sandbox"
	"isopod/internal/settings"
	"isopod/internal/stages"
	"isopod/internal/vmm/vmmfake"
)

// A long-lived front end's Service: the first run of a shape boots cold
// and the snapshot is built after it; a run that resumes makes its shape
// hot, and the next runs of it are served by ready VMs, each its own
// machine; Close leaves nothing running. (Another scratch size: the shape
// gets no assembled snapshot, whose build would hold a place besides.)
func TestReadyVMs(t *testing.T) {
	t.Parallel()
	a := newAdmission(t, 8, 8)
	s, d := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) {
		o.ReadyVMs, o.BackgroundSnapshots, o.Places = 1, true, a
	})
	first := run(t, s, sandbox.Request{Argv: []string{"echo", "one"}, ScratchMiB: otherScratch})
	if first.Path != "cold" || first.SnapshotBuilt || first.ReadyVM {
		t.Fatalf("first run: path %q built %v ready %v; want a cold boot, the snapshot built after it", first.Path, first.SnapshotBuilt, first.ReadyVM)
	}
	waitFor(t, "the background snapshot", func() bool {
		l, err := s.WarmList(context.Background())
		return err == nil && len(l.Snapshots) == 1
	})
	second := run(t, s, sandbox.Request{Argv: []string{"echo", "two"}, ScratchMiB: otherScratch})
	if second.Path != "warm" || second.ReadyVM || second.SnapshotBuilt {
		t.Fatalf("second run: path %q ready %v built %v; want a plain resume", second.Path, second.ReadyVM, second.SnapshotBuilt)
	}
	var names []string
	for i := 0; i < 2; i++ {
		waitFor(t, "a ready VM", func() bool { return readyIn(a, d) == 1 })
		rep := run(t, s, sandbox.Request{Argv: []string{"echo", "ready"}, ScratchMiB: otherScratch})
		if rep.Path != "warm" || !rep.ReadyVM || rep.Stdout != "ready\n" || rep.ResumeMS == nil {
			t.Fatalf("run %d: path %q ready %v stdout %q; want one served by a ready VM", i, rep.Path, rep.ReadyVM, rep.Stdout)
		}
		if rep.Net == nil || rep.GuestIP == "" {
			t.Errorf("run %d: net %+v ip %q; want the run's network on the ready VM's NIC", i, rep.Net, rep.GuestIP)
		}
		names = append(names, rep.Name)
		m := machineOf(t, d, rep.VMID)
		st := m.State()
		if st.Hostname != rep.Name || st.EntropyBytes < 64 || st.Clock.IsZero() || st.Mount == nil || !st.Mount.Flush {
			t.Errorf("run %d: guest state %+v; want the run's hostname, fresh entropy, a clock and a flushed mount", i, st)
		}
	}
	if names[0] == names[1] {
		t.Errorf("two ready runs share the name %q", names[0])
	}
	waitFor(t, "the refill", func() bool { return readyIn(a, d) == 1 })
	if n := a.Stats().Background; n != 1 {
		t.Errorf("%d places held with one ready VM waiting; want 1", n)
	}
	s.Close()
	if st := a.Stats(); st.Background != 0 || st.Running != 0 {
		t.Errorf("places still held after Close: %+v", st)
	}
}

// Without a place under the front end's limits no ready VM is made, and
// runs resume as usual.
func TestReadyVMsNeedRoom(t *testing.T) {
	t.Parallel()
	s, d := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) {
		o.ReadyVMs, o.Places = 1, noRoom{}
	})
	for i := 0; i < 3; i++ {
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}})
		if rep.ReadyVM || rep.Path != "warm" && !rep.SnapshotBuilt {
			t.Errorf("run %d: path %q ready %v; want a plain warm run", i, rep.Path, rep.ReadyVM)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if n := waitingMachines(d); n != 0 {
		t.Errorf("%d ready VMs made without room", n)
	}
}

// noRoom is a front end's admission that never has a place.
type noRoom struct{}

func (noRoom) TryHold(int, admission.Yield) (*admission.Ticket, bool) { return nil, false }
func (noRoom) Freed() <-chan struct{}                                 { return nil }
func (noRoom) CanHold(int) bool                                       { return true }

// readyIn counts the ready VMs that wait in the pool (made, and their
// places lendable), -1 while that differs from the waiting machines.
func readyIn(a *admission.Admission, d *vmmfake.Driver) int {
	if n := a.Stats().Lendable; n == waitingMachines(d) {
		return n
	}
	return -1
}

// waitingMachines counts the restored machines that still run, their
// root assembled, and that no run claimed (none gave them a boot id).
func waitingMachines(d *vmmfake.Driver) int {
	n := 0
	for _, m := range d.Machines() {
		select {
		case <-m.Done():
			continue
		default:
		}
		if st := m.State(); m.Restored() && st.Mount != nil && st.BootID == "" {
			n++
		}
	}
	return n
}

// machineOf is the machine of the run vmID.
func machineOf(t *testing.T, d *vmmfake.Driver, vmID string) *vmmfake.Machine {
	t.Helper()
	for _, m := range d.Machines() {
		if m.Config().ID == vmID {
			return m
		}
	}
	t.Fatalf("no machine for %s", vmID)
	return nil
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

// A ready VM made with a stage's layer is never handed to a run once the
// stage is removed: not to a fork of the same stage put back under the
// same id (its layer is another file now), and the next run's refill
// discards those of a removed stage, so that nothing holds its layer.
func TestReadyVMsOfRemovedStage(t *testing.T) {
	t.Parallel()
	a := newAdmission(t, 8, 8)
	var set settings.Settings
	s, d := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) {
		o.ReadyVMs, o.Places, set = 1, a, o.Settings
	})
	st := stages.New(stages.Options{Settings: set, Version: "test", Removed: s.StageRemoved})
	ctx := context.Background()
	commit := run(t, s, sandbox.Request{Argv: []string{"sh", "-c", "echo s > /s"}, NoNetwork: true, CommitAs: "lay"})
	if commit.StageID == "" {
		t.Fatalf("not committed: %+v", commit)
	}
	info, err := st.StageInfo(ctx, "lay")
	if err != nil {
		t.Fatal(err)
	}
	layer := info.LayerPaths[0]
	layerBytes, err := os.ReadFile(layer)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := os.ReadFile(filepath.Join(filepath.Dir(layer), "meta.json"))
	if err != nil {
		t.Fatal(err)
	}
	fork := sandbox.Request{Argv: []string{"cat", "/s"}, NoNetwork: true, Stage: commit.StageID}
	if rep := run(t, s, fork); rep.Path != "warm" || rep.Stdout != "s\n" {
		t.Fatalf("fork: path %q stdout %q", rep.Path, rep.Stdout)
	}
	// A ready VM of the base shape (hot since the commit) and of the fork's.
	waitFor(t, "ready VMs of both shapes", func() bool { return readyIn(a, d) == 2 })

	// Removed and put back (as a pull of the same stage would): the same
	// id and path, another file.
	if _, err := st.StageRemove(ctx, "lay"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(layer), 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(filepath.Dir(layer), "meta.json"), meta, 0o600)
	if err := os.WriteFile(layer, layerBytes, 0o600); err != nil {
		t.Fatal(err)
	}
	rep := run(t, s, fork)
	if rep.ReadyVM || rep.Stdout != "s\n" {
		t.Errorf("fork of the stage put back: ready %v stdout %q; want a VM made with the new layer file", rep.ReadyVM, rep.Stdout)
	}
	waitFor(t, "the refill", func() bool { return readyIn(a, d) == 2 })

	// Removed for good: the next run's refill discards its ready VM.
	if _, err := st.StageRemove(ctx, "lay"); err != nil {
		t.Fatal(err)
	}
	if rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true}); !rep.ReadyVM {
		t.Errorf("base run: not served by its ready VM")
	}
	waitFor(t, "only the base shape's ready VM", func() bool { return readyIn(a, d) == 1 })
	for _, m := range d.Machines() {
		select {
		case <-m.Done():
			continue
		default:
		}
		for _, disk := range m.Config().Disks {
			if disk.Path == layer {
				t.Errorf("machine %s still has the removed stage's layer", m.Config().ID)
			}
		}
	}
}
