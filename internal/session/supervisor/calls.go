package supervisor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
)

// call does what c asks of the session's VM.
func (s *sup) call(ctx context.Context, c session.Call) (any, error) {
	switch c.Op {
	case session.OpPing:
		return s.snapshot(), nil
	case session.OpExec:
		return s.exec(ctx, c)
	case session.OpJob:
		return s.job(ctx, c)
	case session.OpJobs:
		jobs, err := s.vm.JobList(ctx)
		if jobs == nil {
			jobs = []agentproto.JobInfo{}
		}
		return session.Reply{OK: true, SessionID: s.o.ID, Jobs: jobs}, err
	case session.OpPut:
		return s.put(ctx, c)
	case session.OpGet:
		return s.get(ctx, c)
	case session.OpExpose:
		return s.expose(c)
	case session.OpCommit:
		return s.commit(ctx, c)
	case session.OpPause:
		return s.pauseCall()
	case session.OpFork:
		return s.forkCall(ctx, c)
	case session.OpStop:
		s.requestStop("stopped by a stop call")
		<-s.ended
		return s.final(), nil
	}
	// A call this supervisor does not know comes from a newer isopod.
	return nil, fmt.Errorf("this session's supervisor has no %q call: %w", c.Op, errdefs.ErrNotSupported)
}

// Final is the answer to a stop call.
type Final struct {
	OK        bool    `json:"ok"`
	SessionID string  `json:"session_id"`
	Name      string  `json:"name"`
	State     string  `json:"state"`
	Reason    string  `json:"reason,omitempty"`
	VMID      string  `json:"vm_id"`
	LifetimeS float64 `json:"lifetime_s"`
	Execs     int     `json:"execs"`
	// Egress is a filtered session's egress summary, as a run reports it.
	Egress any `json:"egress,omitempty"`
}

func (s *sup) final() Final {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.rec
	f := Final{OK: true, SessionID: r.ID, Name: r.Name, State: r.State, Reason: r.Reason, VMID: r.VMID,
		LifetimeS: r.Stopped.Sub(r.Created).Seconds(), Execs: r.Execs}
	if s.vm != nil {
		f.Egress = s.vm.Egress()
	}
	return f
}

// snapshot is the session's record now.
func (s *sup) snapshot() session.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := *s.rec
	r.Execs = s.vm.Execs()
	return r
}

// request is c's command as the core takes it, with the session's own
// environment and directory as defaults.
func (s *sup) request(c session.Call) ExecRequest {
	spec := s.rec.Spec
	cwd := c.Cwd
	if cwd == "" {
		cwd = spec.Cwd
	}
	var stdin io.Reader
	if c.Stdin != nil {
		stdin = bytes.NewReader(c.Stdin)
	}
	return ExecRequest{Argv: c.Argv, Shell: c.Shell, Env: append(append([]string(nil), spec.Env...), c.Env...),
		Cwd: cwd, Stdin: stdin, TimeoutS: c.TimeoutS, Keep: true}
}

func (s *sup) exec(ctx context.Context, c session.Call) (any, error) {
	e := s.request(c)
	if c.Detach {
		info, err := s.vm.StartJob(ctx, e)
		if err != nil {
			return nil, err
		}
		return session.Reply{OK: true, SessionID: s.o.ID, JobID: info.ID}, nil
	}
	rep, err := s.vm.Exec(ctx, e)
	if err != nil {
		return nil, err
	}
	return struct {
		*ExecReport
		SessionID string `json:"session_id"`
	}{rep, s.o.ID}, nil
}

// JobReport is the answer to a job call.
type JobReport struct {
	OK        bool   `json:"ok"`
	SessionID string `json:"session_id"`
	Job       any    `json:"job"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
}

func (s *sup) job(ctx context.Context, c session.Call) (any, error) {
	if c.Job == "" {
		return nil, fmt.Errorf("no job: name one (see isopod session jobs): %w", errdefs.ErrInvalidArgument)
	}
	if c.WaitS < 0 || c.WaitS > sandbox.MaxTimeoutS {
		return nil, fmt.Errorf("wait_s %d: must be 0 to %d: %w", c.WaitS, sandbox.MaxTimeoutS, errdefs.ErrInvalidArgument)
	}
	if c.Kill {
		if err := s.vm.JobKill(ctx, c.Job, int(syscall.SIGKILL)); err != nil {
			return nil, err
		}
		if c.WaitS == 0 {
			c.WaitS = 5
		}
	}
	out, err := s.vm.JobWait(ctx, c.Job, time.Duration(c.WaitS)*time.Second)
	if err != nil {
		return nil, err
	}
	return JobReport{OK: true, SessionID: s.o.ID, Job: out.JobInfo, Stdout: string(out.Stdout), Stderr: string(out.Stderr)}, nil
}

func (s *sup) put(ctx context.Context, c session.Call) (any, error) {
	if c.Path == "" || c.Path[0] != '/' {
		return nil, fmt.Errorf("put %q: the guest path must be absolute: %w", c.Path, errdefs.ErrInvalidArgument)
	}
	n, err := s.vm.PutFile(ctx, c.Path, fs.FileMode(c.Mode).Perm(), session.MaxFileBytes, bytes.NewReader(c.Data))
	if err != nil {
		return nil, err
	}
	return session.Reply{OK: true, SessionID: s.o.ID, Path: c.Path, Bytes: &n}, nil
}

// buffer collects a file written at offsets, at most max bytes.
type buffer struct {
	b   []byte
	max int64
}

func (w *buffer) WriteAt(p []byte, off int64) (int, error) {
	end := off + int64(len(p))
	if end > w.max {
		return 0, fmt.Errorf("the file is over %d bytes: %w", w.max, errdefs.ErrInvalidArgument)
	}
	if end > int64(len(w.b)) {
		w.b = append(w.b, make([]byte, end-int64(len(w.b)))...)
	}
	copy(w.b[off:], p)
	return len(p), nil
}

// GetResult is the answer to a get call.
type GetResult struct {
	OK   bool   `json:"ok"`
	Path string `json:"path"`
	Mode uint32 `json:"mode"`
	Data []byte `json:"data"`
}

func (s *sup) get(ctx context.Context, c session.Call) (any, error) {
	if c.Path == "" || c.Path[0] != '/' {
		return nil, fmt.Errorf("get %q: the guest path must be absolute: %w", c.Path, errdefs.ErrInvalidArgument)
	}
	w := &buffer{max: session.MaxFileBytes}
	done, err := s.vm.GetFile(ctx, c.Path, session.MaxFileBytes, w)
	if err != nil {
		return nil, err
	}
	if done != nil && done.Bytes > int64(len(w.b)) {
		w.b = append(w.b, make([]byte, done.Bytes-int64(len(w.b)))...)
	}
	var mode uint32
	if done != nil {
		mode = done.Mode
	}
	return GetResult{OK: true, Path: c.Path, Mode: mode, Data: w.b}, nil
}

func (s *sup) expose(c session.Call) (any, error) {
	if c.GuestPort <= 0 || c.GuestPort > 65535 || c.HostPort < 0 || c.HostPort > 65535 {
		return nil, fmt.Errorf("ports must be 1..65535 (host port 0: any free one): %w", errdefs.ErrInvalidArgument)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(c.HostPort)))
	if err != nil {
		return nil, fmt.Errorf("listening on host port %d: %w: %w", c.HostPort, err, errdefs.ErrFailedPrecondition)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	s.relay(c.GuestPort, ln)
	return session.Reply{OK: true, SessionID: s.o.ID, GuestPort: c.GuestPort, HostPort: port, Address: ln.Addr().String()}, nil
}

// relay relays connections accepted on ln to guestPort for the session's
// life, and lists it in the record.
func (s *sup) relay(guestPort int, ln net.Listener) {
	s.mu.Lock()
	s.rec.Exposed = append(s.rec.Exposed, session.Exposed{GuestPort: guestPort, Address: ln.Addr().String()})
	s.mu.Unlock()
	s.exposes.Add(1)
	go func() {
		defer s.exposes.Done()
		if err := s.vm.Expose(s.exposeCtx, guestPort, &busyListener{Listener: ln, s: s}); err != nil {
			s.log.Warn("exposing a guest port", "port", guestPort, "err", err)
		}
	}()
}

// busyListener counts each connection it accepts as a call in progress
// until it is closed, so that a session used only through an exposed port
// is not idle.
type busyListener struct {
	net.Listener
	s *sup
}

func (l *busyListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.s.busy()
	return &busyConn{Conn: c, s: l.s}, nil
}

type busyConn struct {
	net.Conn
	s    *sup
	once sync.Once
}

func (c *busyConn) Close() error {
	c.once.Do(c.s.idle)
	return c.Conn.Close()
}

// CloseWrite passes a half-close on, as the relay expects of a TCP
// connection.
func (c *busyConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
