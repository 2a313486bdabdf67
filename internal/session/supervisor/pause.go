package supervisor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/pausefile"
	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// A pause ends the supervisor as a stop does, but the VM's memory and
// device state are written to the session's pause directory first and its
// disks kept (VM.Pause); the record reads paused. A supervisor
// started with Options.Resume restores the VM from there
// (sandbox.Service.ResumeVM) and relays the exposed ports again.

// pauseTimeout bounds writing a pause's snapshot.
const pauseTimeout = 5 * time.Minute

// PauseReport is the answer to a pause call.
type PauseReport struct {
	OK          bool   `json:"ok"`
	SessionID   string `json:"session_id"`
	Name        string `json:"name"`
	State       string `json:"state"`
	Reason      string `json:"reason,omitempty"`
	PauseMS     int64  `json:"pause_ms"`
	MemoryBytes int64  `json:"memory_bytes"`
	DiskBytes   int64  `json:"disk_bytes"`
}

// requestPause ends the session paused, with why.
func (s *sup) requestPause(why string) {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopWhy, s.pause, s.ending = why, true, true
		s.mu.Unlock()
		close(s.stop)
	})
}

func (s *sup) pausing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pause
}

// pauseCall pauses the session for a pause call, unless other calls are
// in progress or the pause would go over the disk budget: the session
// then keeps running.
func (s *sup) pauseCall() (any, error) {
	s.mu.Lock()
	others := s.active - 1
	s.mu.Unlock()
	if others > 0 {
		return nil, fmt.Errorf("%d other calls to the session are in progress: pause it once they end: %w", others, errdefs.ErrFailedPrecondition)
	}
	if err := s.checkBudget(); err != nil {
		return nil, err
	}
	s.requestPause("paused by a pause call")
	<-s.ended
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pauseErr != nil {
		return nil, s.pauseErr
	}
	r := s.rec
	if r.State != session.StatePaused {
		return nil, fmt.Errorf("session %s %s before it could pause (%s): %w", r.ID, r.State, r.Reason, errdefs.ErrFailedPrecondition)
	}
	return PauseReport{OK: true, SessionID: r.ID, Name: r.Name, State: r.State, PauseMS: r.PauseMS,
		MemoryBytes: r.MemoryBytes, DiskBytes: r.DiskBytes}, nil
}

// checkBudget refuses a pause that would take what paused sessions hold
// on disk over Options.DiskBudget: the others' and, at most, this
// session's RAM and its disks now.
func (s *sup) checkBudget() error {
	if s.o.DiskBudget <= 0 {
		return nil
	}
	others := s.o.Store.PausedBytes(s.o.ID)
	own := s.vm.HeldBytes()
	if others+own <= s.o.DiskBudget {
		return nil
	}
	return fmt.Errorf("pausing would take what paused sessions hold on disk to %d MiB (this one up to %d MiB), over %s=%d MiB: stop or resume a paused session, or raise it: %w",
		(others+own)>>20, own>>20, s.o.BudgetSetting, s.o.DiskBudget>>20, errdefs.ErrResourceExhausted)
}

// idleEnd is why the session ends at its idle timeout: it pauses unless
// its idle action is stop or the pause would go over the disk budget.
func (s *sup) idleEnd() string {
	why := fmt.Sprintf("idle for %d s (its idle timeout)", s.rec.IdleTimeoutS)
	if !s.rec.PausesOnIdle() {
		return why
	}
	if err := s.checkBudget(); err != nil {
		return why + "; stopped, not paused: " + err.Error()
	}
	s.requestPause(why)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopWhy
}

// pauseVM pauses the VM into the session's pause directory and returns
// the session's final state and why; a pause that fails stops it.
func (s *sup) pauseVM(why string) (string, string) {
	dir := s.o.Store.PauseDir(s.o.ID)
	os.RemoveAll(dir)
	fail := func(err error) (string, string) {
		os.RemoveAll(dir)
		s.mu.Lock()
		s.pauseErr = fmt.Errorf("pausing the session: %w", err)
		s.mu.Unlock()
		s.log.Error("pausing the session", "err", err)
		return session.StateStopped, why + "; pausing failed, so it stopped: " + err.Error()
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		s.vm.Close()
		return fail(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), pauseTimeout)
	defer cancel()
	t := time.Now()
	res, err := s.vm.Pause(ctx, dir)
	if err != nil {
		return fail(err)
	}
	s.mu.Lock()
	s.rec.Paused, s.rec.PauseMS = time.Now().UTC(), time.Since(t).Milliseconds()
	s.rec.MemoryBytes, s.rec.DiskBytes = res.MemoryBytes, res.DiskBytes
	s.mu.Unlock()
	s.log.Info("session paused", "id", s.o.ID, "pause_ms", s.rec.PauseMS, "memory_bytes", res.MemoryBytes, "disk_bytes", res.DiskBytes, "close_ms", res.closeMS)
	return session.StatePaused, why
}

// resumeVM restores the session's VM from its pause directory, which
// goes once the VM runs (it holds RAM of its own). A fork's resume is
// admitted while the parent's VM is copied into the directory.
func (s *sup) resumeVM(ctx context.Context) (*sandbox.Held, error) {
	t := time.Now()
	dir := s.o.Store.PauseDir(s.o.ID)
	var h *sandbox.Held
	var err error
	if s.o.ForkFrom != "" {
		h, err = s.resumeFork(ctx, dir)
	} else {
		h, err = s.o.Service.ResumeVM(ctx, s.o.Request, dir)
	}
	if err != nil {
		return nil, err
	}
	s.removeAside(dir)
	s.mu.Lock()
	if ms := h.Info().ResumeMS; ms != nil {
		s.rec.ResumeMS = *ms
	}
	// At least 1: a record with no resume time is one that never resumed.
	s.rec.ResumeTotalMS = max(time.Since(t).Milliseconds(), 1)
	s.mu.Unlock()
	return h, nil
}

// removeAside moves dir, a pause directory the resumed VM no longer
// needs, out of the way at once and removes it in the background (its
// RAM file takes a while to free); Run waits for the removal.
func (s *sup) removeAside(dir string) {
	gone := fmt.Sprintf("%s.gone-%d", dir, time.Now().UnixNano())
	if err := os.Rename(dir, gone); err != nil {
		os.RemoveAll(dir)
		return
	}
	s.removals.Go(func() { os.RemoveAll(gone) })
}

// notStarted writes why the VM did not start: a resume that failed keeps
// the pause for another try, unless what the snapshot depends on changed
// (the session is lost then, its pause removed).
func (s *sup) notStarted(err error) {
	switch {
	case !s.o.Resume:
		s.finish(session.StateStopped, "the VM could not start: "+err.Error())
	case s.o.ForkFrom != "":
		discard(s.o.Store, s.o.ID)
		s.finish(session.StateStopped, "the fork could not start: "+err.Error())
	case errors.Is(err, pausefile.ErrChanged):
		discard(s.o.Store, s.o.ID)
		s.finish(session.StateLost, "it cannot be resumed: "+err.Error())
	default:
		s.finish(session.StatePaused, "resuming failed (the pause is kept): "+err.Error())
	}
}

// reexpose relays again, after a resume, the ports the record lists, on
// the same host addresses.
func (s *sup) reexpose() {
	if !s.o.Resume {
		return
	}
	s.mu.Lock()
	exposed := s.rec.Exposed
	s.rec.Exposed = nil
	s.mu.Unlock()
	for _, e := range exposed {
		ln, err := net.Listen("tcp", e.Address)
		if err != nil {
			s.log.Warn("exposing a guest port again after the resume", "port", e.GuestPort, "address", e.Address, "err", err)
			continue
		}
		s.relay(e.GuestPort, ln)
	}
}

// discard removes what session id's pause kept: its snapshot, the VM's
// disks.
func discard(st session.Store, id string) {
	dir := st.PauseDir(id)
	if p, err := pausefile.Read(dir); err == nil {
		discardPaused(p)
	}
	os.RemoveAll(dir)
}

// StopPaused stops the paused session rec without resuming it: what its
// pause kept goes.
func StopPaused(st session.Store, rec *session.Record) (Final, error) {
	discard(st, rec.ID)
	rec.State, rec.Reason, rec.Stopped = session.StateStopped, "stopped while paused", time.Now().UTC()
	if err := st.Write(rec); err != nil {
		return Final{}, err
	}
	return Final{OK: true, SessionID: rec.ID, Name: rec.Name, State: rec.State, Reason: rec.Reason, VMID: rec.VMID,
		LifetimeS: rec.Stopped.Sub(rec.Created).Seconds(), Execs: rec.Execs}, nil
}

// LosePaused marks the paused session rec lost for why (what its
// snapshot depends on changed), removing what its pause kept.
func LosePaused(st session.Store, rec *session.Record, why string) {
	discard(st, rec.ID)
	rec.State, rec.Reason = session.StateLost, "it cannot be resumed: "+why
	st.Write(rec)
}
