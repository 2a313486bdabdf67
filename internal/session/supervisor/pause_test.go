package supervisor_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// waitEnd waits for the supervisor to exit.
func (s *started) waitEnd(t *testing.T) {
	t.Helper()
	select {
	case err := <-s.done:
		if err != nil {
			t.Fatalf("supervisor: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the supervisor did not end")
	}
}

// A pause call writes the VM to disk and ends its VMM and supervisor,
// the record paused; a supervisor started to resume brings the VM back
// from there, execs numbered on, and removes the pause.
func TestSupervisorPauseResume(t *testing.T) {
	s := start(t, 0)
	var ex supervisor.ExecReport
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"true"}}, &ex)
	var p supervisor.PauseReport
	s.must(t, session.Call{Op: session.OpPause}, &p)
	if !p.OK || p.State != session.StatePaused || p.MemoryBytes <= 0 {
		t.Errorf("pause: %+v; want paused, its memory held", p)
	}
	s.waitEnd(t)
	for _, m := range s.drv.Machines() {
		select {
		case <-m.Done():
		default:
			t.Errorf("machine %s still runs after the pause", m.Config().ID)
		}
	}
	r, err := s.store.Load(s.rec.ID)
	if err != nil || r.State != session.StatePaused || r.PauseMS < 0 || r.MemoryBytes != p.MemoryBytes {
		t.Fatalf("record after pause: %+v, %v; want paused", r, err)
	}
	if a := s.run(t, true); !a.OK {
		t.Fatalf("resume: %+v", a)
	}
	r, err = s.store.Load(s.rec.ID)
	if err != nil || r.State != session.StateRunning || r.ResumeMS < 0 || !r.Summary().Resumed {
		t.Errorf("record after resume: %+v, %v; want running, resumed", r, err)
	}
	// resume_ms is the restore and the hello, as a warm run's; the whole
	// resume is resume_total_ms.
	if sm := r.Summary(); sm.ResumeTotalMS < r.ResumeMS || sm.ResumeTotalMS <= 0 {
		t.Errorf("resume_total_ms %d, resume_ms %d; want the whole resume, at least its restore", sm.ResumeTotalMS, r.ResumeMS)
	}
	if _, err := os.Stat(s.store.PauseDir(s.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pause directory after resume: %v; want it removed", err)
	}
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"true"}}, &ex)
	if !strings.HasSuffix(ex.StdoutLogPath, "exec-2.stdout.log") {
		t.Errorf("exec after resume logs to %s; want exec-2", ex.StdoutLogPath)
	}
	// The pause directory, moved aside at the resume, is gone once the
	// supervisor ends.
	s.call(t, session.Call{Op: session.OpStop})
	s.waitEnd(t)
	s.done <- nil // for the cleanup's wait
	if left, _ := filepath.Glob(s.store.PauseDir(s.rec.ID) + "*"); len(left) != 0 {
		t.Errorf("left after the session ended: %v", left)
	}
}

// A pause that would take paused sessions over the disk budget is
// refused, naming the setting, and the session keeps running.
func TestSupervisorPauseOverBudget(t *testing.T) {
	s := startWith(t, 0, 0, func(o *supervisor.Options) { o.DiskBudget, o.BudgetSetting = 4096, "ISOPOD_X_MIB" })
	_, err := s.call(t, session.Call{Op: session.OpPause})
	if !errors.Is(err, errdefs.ErrResourceExhausted) || !strings.Contains(err.Error(), "ISOPOD_X_MIB") {
		t.Fatalf("pause over budget: %v; want resource exhausted naming the setting", err)
	}
	var r session.Record
	s.must(t, session.Call{Op: session.OpPing}, &r)
	if r.State != session.StateRunning {
		t.Errorf("after a refused pause: %s; want running", r.State)
	}
}

// An idle pause over the disk budget stops the session instead, saying
// why.
func TestSupervisorIdleOverBudget(t *testing.T) {
	t.Parallel()
	s := startWith(t, 1, 0, func(o *supervisor.Options) { o.DiskBudget, o.BudgetSetting = 4096, "ISOPOD_X_MIB" })
	s.endsBy(t, "ISOPOD_X_MIB")
}

// A paused session whose snapshot's identity (VMM, kernel, agent)
// changed is lost on resume, and what its pause kept goes.
func TestSupervisorResumeChanged(t *testing.T) {
	s := start(t, 0)
	var p supervisor.PauseReport
	s.must(t, session.Call{Op: session.OpPause}, &p)
	s.waitEnd(t)
	path := filepath.Join(s.store.PauseDir(s.rec.ID), "paused.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var desc map[string]any
	json.Unmarshal(b, &desc)
	desc["identity"].(map[string]any)["vmm"] = "another build"
	b, _ = json.Marshal(desc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	a := s.run(t, true)
	<-s.done
	if a.OK || a.Class != "failed_precondition" {
		t.Errorf("resume of a changed pause: %+v; want failed_precondition", a)
	}
	r, err := s.store.Load(s.rec.ID)
	if err != nil || r.State != session.StateLost || !strings.Contains(r.Reason, "VMM changed") {
		t.Errorf("record: %+v, %v; want lost, the VMM changed", r, err)
	}
	if _, err := os.Stat(s.store.PauseDir(s.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pause directory: %v; want it removed", err)
	}
	s.done <- nil
}

// The maximum lifetime counts from the session's start, pauses included.
func TestSupervisorMaxLifetimeAcrossPause(t *testing.T) {
	s := startLimits(t, 0, 60)
	var p supervisor.PauseReport
	s.must(t, session.Call{Op: session.OpPause}, &p)
	s.waitEnd(t)
	r, err := s.store.Read(s.rec.ID)
	if err != nil {
		t.Fatal(err)
	}
	r.Created = r.Created.Add(-time.Minute)
	if err := s.store.Write(r); err != nil {
		t.Fatal(err)
	}
	if a := s.run(t, true); !a.OK {
		t.Fatalf("resume: %+v", a)
	}
	s.endsBy(t, "maximum lifetime")
}

// forkOf runs the supervisor of a new session forked from s's.
func (s *started) forkOf(t *testing.T) *started {
	t.Helper()
	rec, err := s.store.Create("", s.rec.Spec, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	c := &started{store: s.store, rec: rec, done: make(chan error, 1), drv: s.drv, svc: s.svc,
		opts: func(o *supervisor.Options) { o.ForkFrom = s.rec.ID }}
	t.Cleanup(func() {
		c.call(t, session.Call{Op: session.OpStop})
		<-c.done
	})
	if a := c.run(t, true); !a.OK {
		t.Fatalf("fork: %+v", a)
	}
	return c
}

// A fork of a running session and one of a paused session run in VM
// directories of their own, with copies of the parent's disks and a boot
// id set; the running parent runs on, the paused one stays paused.
func TestSupervisorFork(t *testing.T) {
	s := start(t, 0)
	child := s.forkOf(t)
	var pr, cr session.Record
	s.must(t, session.Call{Op: session.OpPing}, &pr)
	child.must(t, session.Call{Op: session.OpPing}, &cr)
	if pr.State != session.StateRunning || cr.State != session.StateRunning || cr.VMID == pr.VMID || !cr.Summary().Resumed {
		t.Fatalf("parent %+v, fork %+v; want both running, in VMs of their own", pr, cr)
	}
	if _, err := os.Stat(s.store.PauseDir(child.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the fork's pause directory: %v; want it removed once resumed", err)
	}
	var p supervisor.PauseReport
	s.must(t, session.Call{Op: session.OpPause}, &p)
	s.waitEnd(t)
	s.done <- nil
	child2 := s.forkOf(t)
	var c2 session.Record
	child2.must(t, session.Call{Op: session.OpPing}, &c2)
	if r, _ := s.store.Load(s.rec.ID); r.State != session.StatePaused || c2.VMID == pr.VMID || c2.VMID == cr.VMID {
		t.Errorf("after forking the paused parent: parent %s, fork VM %s; want paused, a VM of its own", r.State, c2.VMID)
	}
	boots := 0
	for _, m := range s.drv.Machines() {
		if m.State().BootID != "" {
			boots++
		}
	}
	if boots != 2 {
		t.Errorf("%d machines got a boot id; want the two forks'", boots)
	}
}
