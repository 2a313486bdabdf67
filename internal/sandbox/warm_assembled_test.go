package sandbox_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/sandbox"
	"isopod/internal/settings"
	"isopod/internal/stages"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/warmpool"
	"isopod/internal/workspace"
)

// A shape that recurs gets a snapshot with its root assembled: the CLI
// builds it inside the third run (the shape was used twice), which runs on
// in the snapshot's VM; every later run resumes from it; its scratch image
// stays as it was.
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
	// The third run ran on in the snapshot's VM; the fourth resumed it.
	if e.Uses != 1 || e.ScratchMiB != sandbox.DefaultScratchMiB {
		t.Errorf("uses %d scratch_mib %d; want 1 resume of a default scratch", e.Uses, e.ScratchMiB)
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

// An assembled snapshot that cannot be resumed (here its scratch image is
// gone) is retired with a warning, and the run resumes from the plain one.
func TestUnusableAssembledSnapshotFallsBack(t *testing.T) {
	s, _ := newFakeService(t, vmmfake.Config{})
	if _, err := s.WarmBuild(context.Background(), warmpool.BuildOptions{Stage: sandbox.BaseStage}); err != nil {
		t.Fatal(err)
	}
	e := assembledEntry(t, s)
	if e == nil {
		t.Fatal("warmpool build --stage base built no assembled snapshot")
	}
	if err := os.Remove(filepath.Join(e.Path, warmpool.ScratchFile)); err != nil {
		t.Fatal(err)
	}
	// No plain snapshot was there: the run builds it and runs on.
	rep := run(t, s, sandbox.Request{Argv: []string{"echo", "hi"}, TimeoutS: 60})
	w := strings.Join(rep.Warnings, "\n")
	if rep.RootAssembled || !rep.SnapshotBuilt || rep.Stdout != "hi\n" || !strings.Contains(w, "could not be resumed") ||
		!strings.Contains(w, "scratch disk") || strings.Contains(w, "<nil>") {
		t.Errorf("path %s root_assembled %v built %v stdout %q warnings %q; want the plain snapshot and a warning naming the cause",
			rep.Path, rep.RootAssembled, rep.SnapshotBuilt, rep.Stdout, rep.Warnings)
	}
	if assembledEntry(t, s) != nil {
		t.Error("the unusable assembled snapshot is still listed")
	}
}

// A removed stage takes its assembled snapshots along: at once through
// the stage store's hook, and in `vm gc` when the store had none.
func TestRemovedStagesAssembledSnapshot(t *testing.T) {
	var set settings.Settings
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { set = o.Settings })
	ctx := context.Background()
	for _, hook := range []bool{true, false} {
		label := map[bool]string{true: "hooked", false: "gc"}[hook]
		opts := stages.Options{Settings: set, Version: "test"}
		if hook {
			opts.Removed = func() { warmpool.New(set.Paths, nil).RetireOrphans() }
		}
		st := stages.New(opts)
		if rep := run(t, s, sandbox.Request{Argv: []string{"true"}, CommitAs: label}); rep.StageID == "" {
			t.Fatalf("not committed: %s", rep.CommitError)
		}
		if _, err := s.WarmBuild(ctx, warmpool.BuildOptions{Stage: label}); err != nil {
			t.Fatal(err)
		}
		if assembledEntry(t, s) == nil {
			t.Fatalf("%s: no assembled snapshot", label)
		}
		if _, err := st.StageRemove(ctx, label); err != nil {
			t.Fatal(err)
		}
		if !hook {
			if e := assembledEntry(t, s); e == nil || !e.Stale {
				t.Errorf("%s: the removed stage's snapshot %+v; want it listed stale", label, e)
			}
			if _, err := s.VMGC(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		if e := assembledEntry(t, s); e != nil {
			t.Errorf("%s: the removed stage's assembled snapshot is still there: %+v", label, e)
		}
	}
}

// A run of a shape with an assembled snapshot mounts nothing after its
// resume (the fake guest's state is the snapshot VM's: its mount, not
// flushed, as a mount after a resume is); a run with a workspace, and a
// session's VM, resume from the plain snapshot and mount their root.
func TestWhoResumesAssembled(t *testing.T) {
	s, d := newFakeService(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, o := range []warmpool.BuildOptions{{}, {Stage: sandbox.BaseStage}} {
		if _, err := s.WarmBuild(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}})
	if st := machineOf(t, d, rep.VMID).State(); !rep.RootAssembled || st.Mount == nil || st.Mount.Flush {
		t.Errorf("a plain run: root_assembled %v, mount %+v; want the assembled snapshot's mount and none after the resume", rep.RootAssembled, st.Mount)
	}
	tree := t.TempDir()
	rep = run(t, s, sandbox.Request{Argv: []string{"true"}, Workspace: &workspace.Request{Host: tree, Guest: "/src"}})
	if st := machineOf(t, d, rep.VMID).State(); rep.RootAssembled || rep.Path != "warm" || st.Mount == nil || !st.Mount.Flush {
		t.Errorf("a workspace run: path %s root_assembled %v, mount %+v; want a plain resume and a mount", rep.Path, rep.RootAssembled, st.Mount)
	}
	h, err := s.StartVM(ctx, sandbox.Request{})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	ms := d.Machines()
	if st := ms[len(ms)-1].State(); h.Info().Path != "warm" || st.Mount == nil || !st.Mount.Flush {
		t.Errorf("a session's VM: path %s, mount %+v; want a plain resume and a mount", h.Info().Path, st.Mount)
	}
}

// A recurring shape's run whose timeout leaves too little for a build
// builds no assembled snapshot and says nothing of it: it resumes from
// the plain one.
func TestAssembledBuildNeedsTime(t *testing.T) {
	s, _ := newFakeService(t, vmmfake.Config{})
	if _, err := s.WarmBuild(context.Background(), warmpool.BuildOptions{}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}, TimeoutS: 20})
		if rep.Path != "warm" || rep.SnapshotBuilt || rep.RootAssembled || len(rep.Warnings) > 0 {
			t.Errorf("run %d: path %s snapshot_built %v root_assembled %v warnings %q; want a plain resume and nothing said",
				i+1, rep.Path, rep.SnapshotBuilt, rep.RootAssembled, rep.Warnings)
		}
	}
}

// An assembled snapshot's VM is a clone of its shape's plain snapshot
// where there is one, not a boot; a clone that fails boots instead. Either
// way a run resumes from the snapshot with its root assembled.
func TestAssembledBuiltFromAClone(t *testing.T) {
	// Each booted snapshot VM reads the shell (both of its names: the
	// fake has no base tree); a clone's page cache holds it already.
	for _, tc := range []struct {
		name            string
		failClone       bool
		boots, copyOuts int32
	}{{"clone", false, 1, 2}, {"clone fails", true, 2, 4}} {
		t.Run(tc.name, func(t *testing.T) {
			var boots, copyOuts atomic.Int32
			s, _ := newFakeService(t, vmmfake.Config{
				OnRequest: func(_ *vmmfake.Machine, m *agentproto.Msg) {
					if m.Kind == agentproto.KindCopyOut {
						copyOuts.Add(1)
					}
				},
				FailStart: func(vmm.Config) error { boots.Add(1); return nil },
				FailRestore: func(cfg vmm.Config, _ string) error {
					if tc.failClone && cfg.OwnRAM {
						return errors.New("no clone here")
					}
					return nil
				},
			})
			ctx := context.Background()
			if _, err := s.WarmBuild(ctx, warmpool.BuildOptions{}); err != nil {
				t.Fatal(err)
			}
			res, err := s.WarmBuild(ctx, warmpool.BuildOptions{Stage: sandbox.BaseStage})
			if err != nil || !res.Built || !res.RootAssembled {
				t.Fatalf("assembled build: %+v, %v", res, err)
			}
			if got := boots.Load(); got != tc.boots {
				t.Errorf("%d boots for the plain and the assembled snapshot; want %d", got, tc.boots)
			}
			if got := copyOuts.Load(); got != tc.copyOuts {
				t.Errorf("%d copy-outs of the shell for the two snapshots; want %d", got, tc.copyOuts)
			}
			rep := run(t, s, sandbox.Request{Argv: []string{"echo", "hi"}, TimeoutS: 60})
			if !rep.RootAssembled || rep.Stdout != "hi\n" {
				t.Errorf("run: root_assembled %v stdout %q; want a resume from the assembled snapshot", rep.RootAssembled, rep.Stdout)
			}
		})
	}
}
