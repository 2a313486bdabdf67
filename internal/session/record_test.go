package session_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/session"
	"isopod/internal/vmrecord"
)

func newStore(t *testing.T) session.Store {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return session.Store{Paths: p}
}

// deadPID is the pid and start time of a process that has exited.
func deadPID(t *testing.T) (int, uint64) {
	t.Helper()
	c := exec.Command("true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	pid := c.Process.Pid
	st := vmrecord.ProcStartTime(pid)
	c.Wait()
	return pid, st
}

func TestCreateAndResolve(t *testing.T) {
	st := newStore(t)
	r, err := st.Create("web", session.Spec{Base: "base-min"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if r.IdleTimeoutS != session.DefaultIdleTimeoutS || r.MaxLifetimeS != session.DefaultMaxLifetimeS || r.State != session.StateStarting {
		t.Errorf("record %+v; want the defaults, starting", r)
	}
	fi, err := os.Stat(filepath.Join(st.SessionDir(r.ID), "session.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("session.json: %v, %v; want mode 0600", fi, err)
	}
	if di, err := os.Stat(st.SessionDir(r.ID)); err != nil || di.Mode().Perm() != 0o700 {
		t.Errorf("session dir: %v, %v; want mode 0700", di, err)
	}
	if _, err := st.Create("web", session.Spec{}, 0, 0); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second web: %v; want already exists", err)
	}
	for _, bad := range []string{"Web", "ss-x", "-a", "a b"} {
		if _, err := st.Create(bad, session.Spec{}, 0, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("name %q: %v; want invalid argument", bad, err)
		}
	}
	for _, ref := range []string{r.ID, "web"} {
		if got, err := st.Resolve(ref); err != nil || got.ID != r.ID || got.Spec.Base != "base-min" {
			t.Errorf("Resolve(%q): %+v, %v", ref, got, err)
		}
	}
	if _, err := st.Resolve("nope"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Resolve(nope): %v; want not found", err)
	}
}

// A running session whose supervisor is gone reads lost, frees its name,
// and is pruned; a running one whose supervisor lives is kept.
func TestLostAndPrune(t *testing.T) {
	st := newStore(t)
	lost, err := st.Create("a", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	lost.State = session.StateRunning
	lost.SupervisorPID, lost.SupervisorStart = deadPID(t)
	if err := st.Write(lost); err != nil {
		t.Fatal(err)
	}
	live, err := st.Create("b", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	live.State = session.StateRunning
	live.SupervisorPID = os.Getpid()
	live.SupervisorStart = vmrecord.ProcStartTime(live.SupervisorPID)
	if err := st.Write(live); err != nil {
		t.Fatal(err)
	}
	recs := st.List()
	if len(recs) != 2 || recs[0].State != session.StateLost || recs[0].Reason == "" || recs[1].State != session.StateRunning {
		t.Fatalf("list: %+v %+v; want a lost, b running", recs[0], recs[1])
	}
	if r, err := st.Read(lost.ID); err != nil || r.State != session.StateLost {
		t.Errorf("record on disk: %+v, %v; want lost", r, err)
	}
	if _, err := st.Create("a", session.Spec{}, 0, 0); err != nil {
		t.Errorf("a lost session's name: %v; want it free", err)
	}
	paused, err := st.Create("c", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	paused.State = session.StatePaused
	paused.SupervisorPID, paused.SupervisorStart = deadPID(t)
	if err := st.Write(paused); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create("c", session.Spec{}, 0, 0); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("a paused session's name: %v; want it taken", err)
	}
	removed := st.Prune()
	if len(removed) != 1 || removed[0] != lost.ID {
		t.Errorf("pruned %v; want only %s", removed, lost.ID)
	}
	if r, err := st.Load(paused.ID); err != nil || r.State != session.StatePaused {
		t.Errorf("the paused session after prune: %+v, %v; want it kept, paused", r, err)
	}
	if _, err := os.Stat(st.SessionDir(live.ID)); err != nil {
		t.Errorf("the live session's directory: %v", err)
	}
}

// Starts that race for one name: exactly one gets it.
func TestCreateNameRace(t *testing.T) {
	st := newStore(t)
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			_, err := st.Create("same", session.Spec{}, 0, 0)
			errs <- err
		}()
	}
	won := 0
	for range 8 {
		if err := <-errs; err == nil {
			won++
		} else if !errors.Is(err, errdefs.ErrAlreadyExists) {
			t.Errorf("a losing start: %v; want already exists", err)
		}
	}
	if won != 1 {
		t.Errorf("%d starts got the name; want 1", won)
	}
}
