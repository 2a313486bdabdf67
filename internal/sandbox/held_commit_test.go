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
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session/supervisor"
	"isopod/internal/vmm/vmmfake"
)

// startHeld starts a held VM on s for the test.
func startHeld(t *testing.T, s *sandbox.Service) *supervisor.VM {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := s.StartVM(ctx, sandbox.Request{NoNetwork: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	return supervisor.NewVM(h)
}

// A held VM's commit is refused before the guest is touched when its
// label is bad; else it freezes, copies, thaws and stores the stage a
// run's commit of the same disk stores, and the VM goes on.
func TestHeldCommit(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	// The fake guest leaves its scratch disk as made: a run's commit of it
	// and a session's are the same content.
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CommitAs: "same"})
	if rep.StageID == "" {
		t.Fatalf("the run committed nothing: %s", rep.CommitError)
	}
	h := startHeld(t, s)
	m := d.Machines()[len(d.Machines())-1]
	for _, label := range []string{"", "base", "-x", "a b", "st-0000"} {
		if _, err := h.Commit(ctx, label); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("commit as %q: %v; want invalid_argument", label, err)
		}
	}
	if st := m.State(); st.Freezes != 0 {
		t.Errorf("%d freezes for refused labels; want none", st.Freezes)
	}
	// The same label as a stage's is refused before the guest is
	// touched, as a run's is; the same content as the run's under another
	// label is the run's stage, so refused.
	if _, err := h.Commit(ctx, "same"); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a taken label: %v; want already_exists", err)
	}
	if st := m.State(); st.Freezes != 0 {
		t.Errorf("%d freezes for refused labels; want none", st.Freezes)
	}
	_, err := h.Commit(ctx, "again")
	if !errors.Is(err, errdefs.ErrAlreadyExists) || !strings.Contains(err.Error(), rep.StageID) {
		t.Errorf("the run's content again: %v; want already_exists naming the run's stage %s", err, rep.StageID)
	}
	// What the guest writes (here: the host, for the fake guest) is in the
	// stage.
	scratch := filepath.Join(filepath.Dir(h.Info().SerialLog), "scratch.ext4")
	f, err := os.OpenFile(scratch, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("written in the session"), 1<<20)
	f.Close()
	hc, err := h.Commit(ctx, "sess")
	if err != nil || hc.StageID == "" || hc.StageID == rep.StageID {
		t.Fatalf("commit: %+v, %v; want a new stage", hc, err)
	}
	if st := m.State(); st.Freezes != 2 || st.Thaws != 2 || st.Frozen {
		t.Errorf("freezes %d, thaws %d, frozen %v; want two of each, thawed", st.Freezes, st.Thaws, st.Frozen)
	}
	if hc.CommitMS < hc.FrozenMS || hc.FrozenMS < hc.SnapshotMS {
		t.Errorf("timings %+v: the commit holds the freeze, which holds the copy", hc)
	}
	r, err := h.Exec(ctx, supervisor.ExecRequest{Argv: []string{"true"}, Cwd: "/"})
	if err != nil || code2(r.ExitCode) != 0 {
		t.Errorf("exec after the commit: %+v, %v", r, err)
	}
}

// The guest is thawed when the host's side of the commit fails: its call
// cancelled while the guest freezes, the disk's copy failing.
func TestHeldCommitThawsOnFailure(t *testing.T) {
	t.Parallel()
	var onFreeze atomic.Pointer[func()]
	s, d := newColdServiceWith(t, vmmfake.Config{OnRequest: func(_ *vmmfake.Machine, msg *agentproto.Msg) {
		if f := onFreeze.Load(); msg.Kind == agentproto.KindFreeze && f != nil {
			(*f)()
		}
	}})
	h := startHeld(t, s)
	m := d.Machines()[0]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	cctx, ccancel := context.WithCancel(ctx)
	stop := func() { ccancel() }
	onFreeze.Store(&stop)
	if _, err := h.Commit(cctx, "cancelled"); err == nil {
		t.Error("a commit cancelled during the freeze succeeded")
	}
	if st := m.State(); st.Freezes != 1 || st.Thaws != 1 || st.Frozen {
		t.Errorf("after a cancelled commit: freezes %d, thaws %d, frozen %v; want thawed", st.Freezes, st.Thaws, st.Frozen)
	}

	scratch := filepath.Join(filepath.Dir(h.Info().SerialLog), "scratch.ext4")
	lose := func() { os.Rename(scratch, scratch+".away") }
	onFreeze.Store(&lose)
	if _, err := h.Commit(ctx, "nodisk"); err == nil {
		t.Error("a commit whose copy failed succeeded")
	}
	if st := m.State(); st.Freezes != 2 || st.Thaws != 2 || st.Frozen {
		t.Errorf("after a failed copy: freezes %d, thaws %d, frozen %v; want thawed", st.Freezes, st.Thaws, st.Frozen)
	}

	onFreeze.Store(nil)
	if err := os.Rename(scratch+".away", scratch); err != nil {
		t.Fatal(err)
	}
	if hc, err := h.Commit(ctx, "after"); err != nil || hc.StageID == "" {
		t.Errorf("a commit after the failures: %+v, %v", hc, err)
	}
}

// One commit of a VM runs at a time: a second one during the first is
// refused, without a freeze of its own.
func TestHeldCommitOneAtATime(t *testing.T) {
	t.Parallel()
	var h atomic.Pointer[supervisor.VM]
	var once atomic.Bool
	second := make(chan error, 1)
	s, d := newColdServiceWith(t, vmmfake.Config{OnRequest: func(_ *vmmfake.Machine, msg *agentproto.Msg) {
		if held := h.Load(); msg.Kind == agentproto.KindFreeze && held != nil && once.CompareAndSwap(false, true) {
			_, err := held.Commit(context.Background(), "second")
			second <- err
		}
	}})
	h.Store(startHeld(t, s))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := h.Load().Commit(ctx, "first"); err != nil {
		t.Fatal(err)
	}
	if err := <-second; !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a commit during a commit: %v; want failed_precondition", err)
	}
	if st := d.Machines()[0].State(); st.Freezes != 1 || st.Thaws != 1 {
		t.Errorf("freezes %d, thaws %d; want one each", st.Freezes, st.Thaws)
	}
}
