package supervisor_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
	"isopod/internal/settings"
	"isopod/internal/vmm/vmmfake"
)

// started is a supervisor running over the fake VMM, whose "guest" is
// the host.
type started struct {
	store session.Store
	rec   *session.Record
	done  chan error
	drv   *vmmfake.Driver
	svc   *sandbox.Service
	opts  func(*supervisor.Options)
}

// start runs a supervisor for a new session with idle timeout idleS and
// waits for it to answer ready.
func start(t *testing.T, idleS int) *started {
	t.Helper()
	return startLimits(t, idleS, 0)
}

// startLimits is start with a maximum lifetime too.
func startLimits(t *testing.T, idleS, maxS int) *started {
	t.Helper()
	return startWith(t, idleS, maxS, nil)
}

// startWith is startLimits with the supervisor's options set by opts
// (nil: none) and the record by rec.
func startWith(t *testing.T, idleS, maxS int, opts func(*supervisor.Options), recOpts ...func(*session.Record)) *started {
	t.Helper()
	p, kernel := sandboxtest.Root(t, image.FlavorBaseMin)
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	svc, err := sandbox.New(sandbox.Options{Settings: settings.Settings{Paths: p, Kernel: kernel, NoWarmPool: true, Jail: settings.JailOff}, Driver: d, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	st := session.Store{Paths: p}
	rec, err := st.Create("web", session.Spec{NoNetwork: true, Cwd: "/", Env: []string{"A=1"}}, idleS, maxS)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range recOpts {
		o(rec)
	}
	if err := st.Write(rec); err != nil {
		t.Fatal(err)
	}
	s := &started{store: st, rec: rec, done: make(chan error, 1), drv: d, svc: svc, opts: opts}
	t.Cleanup(func() {
		s.call(t, session.Call{Op: session.OpStop})
		select {
		case <-s.done:
		case <-time.After(30 * time.Second):
			t.Error("the supervisor did not end")
		}
		svc.Close()
		for _, m := range d.Machines() {
			select {
			case <-m.Done():
			default:
				t.Errorf("machine %s still runs", m.Config().ID)
				m.Kill()
			}
		}
	})
	if a := s.run(t, false); !a.OK {
		t.Fatalf("ready: %+v", a)
	}
	return s
}

// run runs the session's supervisor (resuming its VM when resume is set)
// and returns its ready answer.
func (s *started) run(t *testing.T, resume bool) session.Answer {
	t.Helper()
	pr, pw, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()
	o := supervisor.Options{Service: s.svc, Store: s.store, ID: s.rec.ID,
		Request: sandbox.Request{NoNetwork: true}, Ready: pw, Resume: resume}
	if s.opts != nil {
		s.opts(&o)
	}
	go func() { s.done <- supervisor.Run(context.Background(), o) }()
	pr.SetReadDeadline(time.Now().Add(30 * time.Second))
	line, err := bufio.NewReader(pr).ReadBytes('\n')
	var a session.Answer
	if err != nil || json.Unmarshal(line, &a) != nil {
		t.Fatalf("ready: %q, %v", line, err)
	}
	return a
}

func (s *started) call(t *testing.T, c session.Call) (json.RawMessage, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return session.Dial(ctx, s.store.Socket(s.rec.ID), c)
}

func (s *started) must(t *testing.T, c session.Call, v any) {
	t.Helper()
	res, err := s.call(t, c)
	if err != nil {
		t.Fatalf("%s: %v", c.Op, err)
	}
	if err := json.Unmarshal(res, v); err != nil {
		t.Fatalf("%s: %s: %v", c.Op, res, err)
	}
}

// One session serves execs, a job, copies both ways and an exposed port;
// a stop ends its VM and writes its final state.
func TestSupervisor(t *testing.T) {
	s := start(t, 0)
	if fi, err := os.Stat(s.store.Socket(s.rec.ID)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket: %v, %v; want mode 0600", fi, err)
	}
	// What a run's report would warn of, the session's record says.
	if r, err := s.store.Load(s.rec.ID); err != nil || !slices.Contains(r.Warnings, sandbox.UnconfinedWarning) || r.Path != "cold" {
		t.Errorf("record: %+v, %v; want a cold VM, the jail's warning", r, err)
	}
	var rep supervisor.ExecReport
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"cat; exit 2"}, Shell: true, Stdin: []byte("in")}, &rep)
	if rep.ExitCode == nil || *rep.ExitCode != 2 || rep.Stdout != "in" {
		t.Errorf("exec: %+v; want exit 2 and the stdin echoed", rep)
	}
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"echo $A$B"}, Shell: true, Env: []string{"B=2"}}, &rep)
	if rep.Stdout != "12\n" {
		t.Errorf("exec env: %q; want the session's A=1 and the exec's B=2", rep.Stdout)
	}
	var job struct {
		JobID string `json:"job_id"`
	}
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"echo later"}, Shell: true, Detach: true}, &job)
	var jr struct{ Stdout string }
	s.must(t, session.Call{Op: session.OpJob, Job: job.JobID, WaitS: 10}, &jr)
	if jr.Stdout != "later\n" {
		t.Errorf("job output %q; want later", jr.Stdout)
	}
	f := filepath.Join(t.TempDir(), "f")
	s.must(t, session.Call{Op: session.OpPut, Path: f, Mode: 0o640, Data: []byte("hello")}, &struct{}{})
	var got supervisor.GetResult
	s.must(t, session.Call{Op: session.OpGet, Path: f}, &got)
	if string(got.Data) != "hello" || got.Mode != 0o640 {
		t.Errorf("get: %q mode %o; want hello 640", got.Data, got.Mode)
	}
	// The fake's guest port is the host's: serve one here.
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	go func() {
		c, err := gl.Accept()
		if err == nil {
			io.WriteString(c, "served")
			c.Close()
		}
	}()
	var ex struct {
		HostPort int    `json:"host_port"`
		Address  string `json:"address"`
	}
	s.must(t, session.Call{Op: session.OpExpose, GuestPort: gl.Addr().(*net.TCPAddr).Port}, &ex)
	if ex.Address != "127.0.0.1:"+strconv.Itoa(ex.HostPort) {
		t.Errorf("expose: %+v", ex)
	}
	c, err := net.Dial("tcp", ex.Address)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(c)
	c.Close()
	if string(b) != "served" {
		t.Errorf("through the exposed port: %q; want served", b)
	}
	// A call of a newer isopod's that this supervisor lacks.
	if _, err := s.call(t, session.Call{Op: "nope"}); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("unknown op: %v; want not supported", err)
	}
	var fin supervisor.Final
	s.must(t, session.Call{Op: session.OpStop}, &fin)
	if fin.State != session.StateStopped || fin.Execs != 3 || fin.LifetimeS <= 0 {
		t.Errorf("final: %+v; want stopped after 3 execs", fin)
	}
	if r, err := s.store.Load(s.rec.ID); err != nil || r.State != session.StateStopped || len(r.Exposed) != 1 {
		t.Errorf("record after stop: %+v, %v; want stopped, one port exposed", r, err)
	}
	if _, err := os.Stat(s.store.Socket(s.rec.ID)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket after stop: %v; want it removed", err)
	}
}

// A session nobody calls pauses at its idle timeout, or stops when its
// idle action says so.
func TestSupervisorIdleTimeout(t *testing.T) {
	t.Parallel()
	s := start(t, 1)
	s.endsIn(t, session.StatePaused, "idle")
	s = startWith(t, 1, 0, nil, func(r *session.Record) { r.IdleAction = session.IdleStop })
	s.endsBy(t, "idle")
}

// endsBy waits for the supervisor to end by itself and checks the reason
// its record gives.
func (s *started) endsBy(t *testing.T, reason string) {
	t.Helper()
	s.endsIn(t, session.StateStopped, reason)
}

// endsIn is endsBy with the final state given.
func (s *started) endsIn(t *testing.T, state, reason string) {
	t.Helper()
	select {
	case err := <-s.done:
		s.done <- err
	case <-time.After(20 * time.Second):
		t.Fatalf("the session did not end (want: %s)", reason)
	}
	r, err := s.store.Load(s.rec.ID)
	if err != nil || r.State != state || !strings.Contains(r.Reason, reason) {
		t.Errorf("record: %+v, %v; want %s, %s", r, err, state, reason)
	}
}

// A session stops at its maximum lifetime, calls or not.
func TestSupervisorMaxLifetime(t *testing.T) {
	t.Parallel()
	s := startLimits(t, 0, 1)
	s.endsBy(t, "maximum lifetime")
}

// A session whose VMM exits ends with it.
func TestSupervisorVMExits(t *testing.T) {
	s := start(t, 0)
	for _, m := range s.drv.Machines() {
		m.Kill()
	}
	s.endsBy(t, "VM exited")
}

// A connection relayed through an exposed port keeps the session from
// going idle while it is open.
func TestSupervisorExposedConnIsNotIdle(t *testing.T) {
	t.Parallel()
	s := start(t, 1)
	gl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gl.Close()
	held := make(chan net.Conn, 1)
	go func() {
		if c, err := gl.Accept(); err == nil {
			held <- c
		}
	}()
	var ex struct{ Address string }
	s.must(t, session.Call{Op: session.OpExpose, GuestPort: gl.Addr().(*net.TCPAddr).Port}, &ex)
	c, err := net.Dial("tcp", ex.Address)
	if err != nil {
		t.Fatal(err)
	}
	guest := <-held
	// Three idle timeouts pass with the connection open.
	select {
	case err := <-s.done:
		s.done <- err
		t.Fatal("the session went idle while a relayed connection was open")
	case <-time.After(3 * time.Second):
	}
	c.Close()
	guest.Close()
	s.endsIn(t, session.StatePaused, "idle")
}

// A connection that never sends its call is dropped, and does not keep
// the session from going idle.
func TestSupervisorSilentConnection(t *testing.T) {
	t.Cleanup(supervisor.SetCallReadTimeout(500 * time.Millisecond))
	s := start(t, 1)
	conn, err := net.Dial("unix", s.store.Socket(s.rec.ID))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(conn); err != nil {
		t.Errorf("the silent connection was not ended by the supervisor: %v", err)
	}
	s.endsIn(t, session.StatePaused, "idle")
}

// A commit call answers the stage the session's filesystem was stored as;
// a bad label is refused as invalid; the session goes on.
func TestSupervisorCommit(t *testing.T) {
	s := start(t, 0)
	if _, err := s.call(t, session.Call{Op: session.OpCommit, Label: "base"}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("commit as base: %v; want invalid_argument", err)
	}
	var rep supervisor.CommitReport
	s.must(t, session.Call{Op: session.OpCommit, Label: "web/deps"}, &rep)
	if !rep.OK || rep.SessionID != s.rec.ID || !strings.HasPrefix(rep.StageID, "st-") || rep.StageName == "" {
		t.Errorf("commit: %+v; want the session's new stage", rep)
	}
	if st := s.drv.Machines()[0].State(); st.Freezes != 1 || st.Thaws != 1 {
		t.Errorf("freezes %d, thaws %d; want one each", st.Freezes, st.Thaws)
	}
	var ex supervisor.ExecReport
	s.must(t, session.Call{Op: session.OpExec, Argv: []string{"true"}}, &ex)
	if ex.ExitCode == nil || *ex.ExitCode != 0 {
		t.Errorf("exec after the commit: %+v", ex)
	}
}
