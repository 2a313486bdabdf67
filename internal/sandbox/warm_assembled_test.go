package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/warmpool"
)

// A shape that recurs gets a snapshot with its root assembled: the CLI
// builds it inside the third run (the shape was used twice), which resumes
// from it, as every later run does; its scratch image stays as it was.
func TestAssembledSnapshotOfARecurringShape(t *testing.T) {
	s, _ := newFakeService(t, vmmfake.Config{})
	want := []struct{ built, assembled bool }{{true, false}, {false, false}, {true, true}, {false, true}}
	for i, w := range want {
		rep := run(t, s, sandbox.Request{Argv: []string{"echo", "hi"}, TimeoutS: 60})
		if rep.Path != "warm" && i > 0 || rep.SnapshotBuilt != w.built || rep.RootAssembled != w.assembled || rep.Stdout != "hi\n" {
			t.Fatalf("run %d: path %s snapshot_built %v root_assembled %v stdout %q; want built %v assembled %v",
				i+1, rep.Path, rep.SnapshotBuilt, rep.RootAssembled, rep.Stdout, w.built, w.assembled)
		}
	}
	e := assembledEntry(t, s)
	if e == nil {
		t.Fatal("no assembled snapshot listed")
	}
	if _, err := os.Stat(filepath.Join(e.Path, warmpool.ScratchFile)); err != nil {
		t.Errorf("the assembled snapshot has no scratch image: %v", err)
	}
	if e.Uses != 2 || e.ScratchMiB != sandbox.DefaultScratchMiB {
		t.Errorf("uses %d scratch_mib %d; want 2 resumes of a default scratch", e.Uses, e.ScratchMiB)
	}
}

// A long-lived front end builds a recurring shape's assembled snapshot in
// the background after its second run; the next run resumes from it.
func TestAssembledSnapshotBuiltInTheBackground(t *testing.T) {
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { o.BackgroundSnapshots = true })
	for i := range 2 {
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}, TimeoutS: 60})
		if rep.SnapshotBuilt || rep.RootAssembled {
			t.Fatalf("run %d: snapshot_built %v root_assembled %v; want neither in the foreground", i+1, rep.SnapshotBuilt, rep.RootAssembled)
		}
		if i == 0 {
			waitFor(t, "the plain snapshot", func() bool { l, _ := s.WarmList(context.Background()); return len(l.Snapshots) == 1 })
		}
	}
	waitFor(t, "the assembled snapshot", func() bool { return assembledEntry(t, s) != nil })
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}, TimeoutS: 60})
	if !rep.RootAssembled || rep.Path != "warm" {
		t.Errorf("third run: path %s root_assembled %v; want a resume from the assembled snapshot", rep.Path, rep.RootAssembled)
	}
}

// assembledEntry is the listing's assembled snapshot (nil: none).
func assembledEntry(t *testing.T, s *sandbox.Service) *warmpool.Entry {
	t.Helper()
	l, err := s.WarmList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for i, e := range l.Snapshots {
		if e.RootAssembled {
			return &l.Snapshots[i]
		}
	}
	return nil
}
