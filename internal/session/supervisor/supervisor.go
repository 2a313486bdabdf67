// Package supervisor is the process that owns one session's VM: it boots
// the VM through the core (sandbox.StartVM), serves the session's control
// socket (session.Call, one per connection), and ends the VM on a stop
// call, at the idle timeout, at the session's maximum lifetime, on
// SIGTERM, or when the VMM exits, writing the final state to the record
// and removing the socket.
package supervisor

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/vmrecord"
)

// tick is how often the supervisor checks its session's timeouts.
const tick = 500 * time.Millisecond

// Options are what a supervisor needs.
type Options struct {
	Service *sandbox.Service
	Store   session.Store
	ID      string
	// Request is the session's VM as the front end built it from the
	// record's Spec.
	Request sandbox.Request
	Logger  *slog.Logger
	// Ready, when set, gets one session.Answer line once the VM serves
	// calls or could not start, and is then closed: the front end that
	// started the supervisor waits on it.
	Ready io.WriteCloser
	// Place, when set, takes the VM's place among the host's VMs (the
	// state root's ledger) before the VM starts, waiting at most the
	// boot timeout while other processes hold them; release gives it
	// back once the VM is gone. A paused session holds none.
	Place func(ctx context.Context) (release func(), err error)
	// Resume restores the session's VM from its pause snapshot instead of
	// starting it.
	Resume bool
	// ForkFrom (with Resume) names the session whose VM this one's is a
	// copy of: its pause is copied, or its running VM snapshotted, into
	// this session's pause directory first (fork.go).
	ForkFrom string
	// DiskBudget caps what paused sessions hold on disk together (bytes;
	// 0: no cap): a pause over it is refused, an idle pause over it stops
	// the session instead. BudgetSetting names the setting that raises it.
	DiskBudget    int64
	BudgetSetting string
}

// sup is one running supervisor.
type sup struct {
	o   Options
	log *slog.Logger
	vm  *VM
	t0  time.Time

	mu       sync.Mutex // guards following
	rec      *session.Record
	active   int
	lastUsed time.Time
	stopWhy  string
	release  func() // gives the VM's place back; nil: none held
	// ending: the session is about to end (a stop, a pause, the idle
	// timeout); calls that come now are turned away (enter).
	ending bool
	// pause: the session ends paused, not stopped (pause.go); pauseErr
	// is why a pause failed.
	pause    bool
	pauseErr error

	stop     chan struct{} // closed by requestStop
	stopOnce sync.Once
	// ended is closed once the final state is written; handlers counts
	// the calls being answered.
	ended    chan struct{}
	handlers sync.WaitGroup
	// exposeCtx ends the session's port relays.
	exposeCtx    context.Context
	exposeCancel context.CancelFunc
	exposes      sync.WaitGroup
	// removals are the removals of what a resume no longer needs
	// (removeAside).
	removals sync.WaitGroup
}

// Run supervises session o.ID until it ends; ctx's end (a signal) ends it
// too. The returned error is why the VM could not start; once it runs,
// its end is written to the record.
func Run(ctx context.Context, o Options) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	rec, err := o.Store.Read(o.ID)
	if err != nil {
		return err
	}
	s := &sup{o: o, log: log, rec: rec, t0: time.Now(), lastUsed: time.Now(), stop: make(chan struct{}), ended: make(chan struct{})}
	if o.Resume && o.ForkFrom == "" {
		// The maximum lifetime counts from the session's start, pauses
		// included.
		s.t0 = rec.Created
	}
	rec.SupervisorPID = os.Getpid()
	rec.SupervisorStart = vmrecord.ProcStartTime(rec.SupervisorPID)
	if err := o.Store.Write(rec); err != nil {
		return err
	}
	ln, err := s.start(ctx)
	if err != nil {
		s.notStarted(err)
		s.ready(err)
		return err
	}
	s.ready(nil)
	s.exposeCtx, s.exposeCancel = context.WithCancel(context.Background())
	s.reexpose()
	go s.serve(ln)
	why := s.wait(ctx)
	ln.Close()
	s.exposeCancel()
	state := session.StateStopped
	if s.pausing() {
		state, why = s.pauseVM(why)
	} else {
		s.vm.Close()
	}
	s.exposes.Wait()
	s.removals.Wait()
	o.Service.Wait()
	s.releasePlace()
	os.Remove(o.Store.Socket(o.ID))
	s.finish(state, why)
	close(s.ended)
	// A stop call answers with the final state: let it go out.
	waitBounded(&s.handlers, 5*time.Second)
	log.Info("session ended", "id", o.ID, "reason", why)
	return nil
}

// ready tells the front end waiting on Options.Ready how the start went.
func (s *sup) ready(err error) {
	if s.o.Ready == nil {
		return
	}
	a := session.Answer{OK: err == nil}
	if err != nil {
		a.Error, a.Class = err.Error(), errdefs.Class(err)
	}
	json.NewEncoder(s.o.Ready).Encode(a)
	s.o.Ready.Close()
}

// start boots the VM and listens on the control socket, then marks the
// record running.
func (s *sup) start(ctx context.Context) (_ net.Listener, retErr error) {
	if err := s.holdPlace(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.o.Service.Wait()
			s.releasePlace()
		}
	}()
	var h *sandbox.Held
	var err error
	if s.o.Resume {
		h, err = s.resumeVM(ctx)
	} else {
		h, err = s.o.Service.StartVM(ctx, s.o.Request)
	}
	if err != nil {
		return nil, err
	}
	s.vm = NewVM(h)
	// Exec logs are numbered on across a pause.
	s.vm.execs = s.rec.Execs
	sock := s.o.Store.Socket(s.o.ID)
	os.Remove(sock)
	ln, err := net.Listen("unix", sock)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("listening on the control socket: %w", err)
	}
	if err := os.Chmod(sock, 0o600); err != nil {
		ln.Close()
		h.Close()
		return nil, fmt.Errorf("securing the control socket: %w", err)
	}
	s.mu.Lock()
	s.rec.State = session.StateRunning
	info := h.Info()
	s.rec.VMID, s.rec.Path, s.rec.GuestIP, s.rec.Warnings = info.VMID, info.Path, info.GuestIP, info.Warnings
	// The idle time counts from when the VM serves, not from before its
	// boot.
	s.lastUsed = time.Now()
	s.rec.LastUsed = s.lastUsed.UTC()
	err = s.o.Store.Write(s.rec)
	s.mu.Unlock()
	if err != nil {
		ln.Close()
		h.Close()
		return nil, err
	}
	s.log.Info("session running", "id", s.o.ID, "vm", s.rec.VMID)
	return ln, nil
}

// holdPlace takes the VM's place (Options.Place), once.
func (s *sup) holdPlace(ctx context.Context) error {
	if s.o.Place == nil {
		return nil
	}
	s.mu.Lock()
	held := s.release != nil
	s.mu.Unlock()
	if held {
		return nil
	}
	release, err := s.o.Place(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.release = release
	s.mu.Unlock()
	return nil
}

// releasePlace gives the VM's place back, if held: once the VM is gone
// (or paused).
func (s *sup) releasePlace() {
	s.mu.Lock()
	release := s.release
	s.release = nil
	s.mu.Unlock()
	if release != nil {
		release()
	}
}

// wait returns why the session ends: a stop call, a timeout, ctx's end or
// the VMM's exit.
func (s *sup) wait(ctx context.Context) string {
	t := time.NewTicker(tick)
	defer t.Stop()
	maxLife := time.Duration(s.rec.MaxLifetimeS) * time.Second
	idle := time.Duration(s.rec.IdleTimeoutS) * time.Second
	for {
		select {
		case <-s.stop:
			s.mu.Lock()
			defer s.mu.Unlock()
			return s.stopWhy
		case <-ctx.Done():
			return "the supervisor was signalled"
		case <-s.vm.Done():
			return "the VM exited"
		case now := <-t.C:
			if now.Sub(s.t0) >= maxLife {
				return fmt.Sprintf("its maximum lifetime (%d s) ran out", s.rec.MaxLifetimeS)
			}
			s.mu.Lock()
			quiet := s.active == 0 && now.Sub(s.lastUsed) >= idle
			s.ending = s.ending || quiet
			s.mu.Unlock()
			if quiet {
				return s.idleEnd()
			}
		}
	}
}

// requestStop ends the session with why.
func (s *sup) requestStop(why string) {
	s.stopOnce.Do(func() {
		s.mu.Lock()
		s.stopWhy, s.ending = why, true
		s.mu.Unlock()
		close(s.stop)
	})
}

// finish writes the session's final state.
func (s *sup) finish(state, why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rec.State, s.rec.Reason = state, why
	if state != session.StatePaused {
		s.rec.Stopped = time.Now().UTC()
	}
	if s.vm != nil {
		s.rec.Execs = s.vm.Execs()
	}
	if err := s.o.Store.Write(s.rec); err != nil {
		s.log.Error("writing the session's final state", "err", err)
	}
}

// callReadTimeout bounds the wait for a call once its connection is made.
var callReadTimeout = 10 * time.Second

// serve answers calls until ln is closed.
func (s *sup) serve(ln net.Listener) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				s.log.Error("accepting a call", "err", err)
			}
			return
		}
		s.handlers.Add(1)
		go func() {
			defer s.handlers.Done()
			s.handle(conn)
		}()
	}
}

// waitBounded waits for wg, at most d.
func waitBounded(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// busy counts a call (or a relayed connection) in progress: the session
// is not idle while one is.
func (s *sup) busy() {
	s.mu.Lock()
	s.active++
	s.mu.Unlock()
}

// enter counts a call in progress, as busy, unless the session is about
// to end: a call that comes while it pauses or stops is turned away
// (unavailable) rather than cut short.
func (s *sup) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ending {
		return false
	}
	s.active++
	return true
}

// idle ends what busy counted and notes the session's last use.
func (s *sup) idle() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	s.lastUsed = time.Now()
	s.rec.LastUsed = s.lastUsed.UTC()
	s.rec.Execs = s.vm.Execs()
	s.o.Store.Write(s.rec)
}

// handle answers one call; the session counts as used while it runs.
func (s *sup) handle(conn net.Conn) {
	defer conn.Close()
	// A peer that connects and says nothing neither holds the
	// connection nor keeps the session from going idle.
	conn.SetReadDeadline(time.Now().Add(callReadTimeout))
	c, err := session.ReadCall(conn)
	if err != nil {
		session.WriteAnswer(conn, nil, err)
		return
	}
	conn.SetReadDeadline(time.Time{})
	if !s.enter() {
		session.WriteAnswer(conn, nil, fmt.Errorf("session %s is pausing or stopping: call again once it has (a call resumes a paused session): %w",
			s.o.ID, errdefs.ErrUnavailable))
		return
	}
	// A call ends when the VM does; the caller going away ends it too.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-s.stop:
		case <-ctx.Done():
		}
		cancel()
	}()
	res, err := s.call(ctx, c)
	if err != nil {
		s.log.Debug("call failed", "op", c.Op, "err", err)
	}
	// The call is over before its caller hears of it: a pause the caller
	// sends next finds no call in progress.
	s.idle()
	session.WriteAnswer(conn, res, err)
}
