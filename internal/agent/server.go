package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// Options configures a [Server].
type Options struct {
	// Logger receives the agent's log lines; nil discards them.
	Logger *slog.Logger
	// ReapAll is set when the agent is PID 1: one process-wide reaper owns
	// wait4(-1) and reaps every orphan. Otherwise each child is waited for
	// by its pid.
	ReapAll bool
	// Hello returns the handshake body; nil means [DefaultHello]. A zero
	// Version is filled with [ProtoVersion] and an empty AgentVersion with
	// [Version].
	Hello func() agentproto.Hello
	// System performs the machine operations (network, clock, hostname,
	// entropy, disk sync). Nil refuses them with an error, which is what a
	// plain process on a host wants.
	System System
	// Cgroups confines each exec in a cgroup of its own under capped
	// parents; nil runs commands unconfined (a plain process).
	Cgroups *Cgroups
	// ExecStub is the agent's own binary, run as an exec stub
	// (exec_stub.go) for the next command; "" forks every command.
	ExecStub string
}

// System is what the agent changes on the machine. The PID-1 agent uses the
// Linux implementation; tests substitute one that records the calls.
type System interface {
	SetHostname(name string) error
	SetClock(t time.Time) error
	// ConfigureNet addresses the NIC, sets the default route and writes
	// /etc/resolv.conf. The config has already been validated.
	ConfigureNet(cfg agentproto.NetConfig) error
	AddEntropy(seed []byte) error
	// SetBootID makes the kernel's boot id read id (validated) from now
	// on: a fork is another boot.
	SetBootID(id string) error
	// SyncDisks flushes every filesystem before power-off.
	SyncDisks() error
	// MountRoot assembles the run's root from the disks m names (once).
	MountRoot(m agentproto.Mount) error
	// FreezeScratch freezes the root's writable layer (see KindFreeze);
	// ThawScratch ends that freeze. A root without a scratch disk cannot
	// be frozen.
	FreezeScratch() error
	ThawScratch() error
	// WorkspaceLayers returns the directories the workspace's changes are
	// read from: its writable layer's upper directory and the original
	// tree ("" without a workspace).
	WorkspaceLayers() (upper, lower string)
}

// Server serves the agent protocol. One Server may serve several
// connections one after another (the PID-1 agent reopens its port); state
// that outlives a connection, such as the environment set by ConfigureNet,
// lives here.
type Server struct {
	opts Options
	log  *slog.Logger

	mu         sync.Mutex
	netEnv     []string
	netApplied *agentproto.NetConfig // the last configuration applied, env aside

	cgroupSeq atomic.Uint64 // names the execs' cgroups, unique across connections
	jobs      jobTable      // background jobs outlive their connection
	freeze    freezer       // the scratch filesystem's one bounded freeze
	pipes     sparePipes    // the next exec's, made ahead
	stub      spareStub     // the next exec's process, made ahead
}

// NewServer returns a Server with opts.
func NewServer(opts Options) *Server {
	log := opts.Logger
	if log == nil {
		log = discardLogger()
	}
	return &Server{opts: opts, log: log}
}

// Serve serves one connection with a fresh [Server]; see [Server.Serve].
func Serve(ctx context.Context, rw io.ReadWriter, opts Options) error {
	return NewServer(opts).Serve(ctx, rw)
}

// handlerGrace bounds how long Serve waits for its request handlers after
// the connection ends; every running exec has been killed by then.
const handlerGrace = 2 * time.Second

// Serve sends Hello (ID 0) on rw and then answers requests until the host
// sends Halt (Serve returns nil), the stream ends or breaks (an error
// wrapping io.EOF or the cause), or ctx is done. Before returning it kills
// every process it started and waits briefly for their handlers, unless
// the host sent KindSession on it: then its execs run on. Background jobs
// are never killed by a connection's end. A read blocked on rw is
// released only when the caller closes rw.
func (s *Server) Serve(ctx context.Context, rw io.ReadWriter) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	c := &conn{
		srv:    s,
		log:    s.log,
		ctx:    ctx,
		w:      &frameWriter{w: rw},
		execs:  make(map[uint64]*execState),
		puts:   make(map[uint64]chan putChunk),
		ports:  make(map[uint64]*portRelay),
		halted: make(chan struct{}),
	}
	if s.opts.ReapAll {
		c.reap = globalReaper()
	} else {
		c.reap = pidReaper{}
	}
	h := s.hello()
	if err := c.send(&agentproto.Msg{ID: 0, Kind: agentproto.KindHello, Hello: &h}, nil); err != nil {
		return fmt.Errorf("sending hello: %w", err)
	}
	readErr := make(chan error, 1)
	go func() { readErr <- c.readLoop(rw) }()
	var err error
	select {
	case err = <-readErr:
	case <-c.halted:
	case <-ctx.Done():
		err = ctx.Err()
	}
	cancel()
	c.mu.Lock()
	c.closing = true
	c.mu.Unlock()
	s.freeze.release(c)
	if c.session.Load() {
		// A session's execs run on; the next connection is served now.
		s.log.Debug("session connection ended; its execs run on", "err", err)
		return err
	}
	done := make(chan struct{})
	go func() { c.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(handlerGrace):
		s.log.Warn("request handlers still running after the connection ended")
	}
	return err
}

func (s *Server) hello() agentproto.Hello {
	var h agentproto.Hello
	if s.opts.Hello != nil {
		h = s.opts.Hello()
	} else {
		h = DefaultHello()
	}
	if h.Version == 0 {
		h.Version = ProtoVersion()
	}
	if h.AgentVersion == "" {
		h.AgentVersion = Version
	}
	return h
}

func (s *Server) execEnv() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.netEnv
}

// frameWriter serialises frames: one mutex, one Write per frame. After a
// failed write every later write fails too, so no frame is ever sent after
// a partial one.
type frameWriter struct {
	mu  sync.Mutex
	w   io.Writer
	err error
}

func (fw *frameWriter) write(m *agentproto.Msg, payload []byte) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.err != nil {
		return fw.err
	}
	if err := agentproto.WriteFrame(fw.w, m, payload); err != nil {
		if !errors.Is(err, agentproto.ErrFrameTooLarge) {
			fw.err = err
		}
		return err
	}
	return nil
}

// conn is the state of one served connection.
type conn struct {
	srv  *Server
	log  *slog.Logger
	ctx  context.Context
	w    *frameWriter
	reap reaper
	wg   sync.WaitGroup

	session atomic.Bool   // the host sent KindSession
	lastID  atomic.Uint64 // the highest request id read (Hello.LastID)

	mu       sync.Mutex
	execs    map[uint64]*execState
	puts     map[uint64]chan putChunk // copy-ins receiving chunks
	ports    map[uint64]*portRelay    // relayed streams
	closing  bool                     // set when Serve stops; no handler starts after it
	freezing chan struct{}            // closed when the last freeze request is handled
	halted   chan struct{}
	haltOnce sync.Once
}

func (c *conn) send(m *agentproto.Msg, payload []byte) error {
	return c.w.write(m, payload)
}

// reply sends a frame and logs a failure; handlers have nobody else to tell.
func (c *conn) reply(m *agentproto.Msg, payload []byte) {
	if err := c.send(m, payload); err != nil {
		c.log.Debug("send failed", "id", m.ID, "kind", string(m.Kind), "err", err)
	}
}

func (c *conn) replyOK(id uint64) { c.reply(&agentproto.Msg{ID: id, Kind: agentproto.KindOK}, nil) }

func (c *conn) replyErr(id uint64, err error) {
	c.log.Debug("request failed", "id", id, "err", err)
	m := &agentproto.Msg{ID: id, Kind: agentproto.KindError, Error: err.Error()}
	if class := errdefs.Class(err); class != "internal" {
		m.Class = class
	}
	c.reply(m, nil)
}

// spawn runs a request handler in its own goroutine so the reader never
// waits for one. It reports false when the connection is closing.
func (c *conn) spawn(f func()) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.spawnLocked(f)
}

func (c *conn) spawnLocked(f func()) bool {
	if c.closing {
		return false
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
	return true
}

// readLoop reads frames and dispatches them until the stream ends or breaks.
func (c *conn) readLoop(r io.Reader) error {
	for {
		m, payload, err := agentproto.ReadFrame(r)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("host closed the connection: %w", err)
			}
			if errors.Is(err, os.ErrClosed) {
				return fmt.Errorf("connection closed: %w", err)
			}
			c.log.Error("reading frame failed; dropping the connection", "err", err)
			return fmt.Errorf("reading frame: %w", err)
		}
		select {
		case <-c.halted:
			continue // halting: nothing more is started
		default:
		}
		if m.ID > c.lastID.Load() {
			c.lastID.Store(m.ID) // only readLoop writes it
		}
		if err := c.dispatch(m, payload); err != nil {
			c.log.Error("protocol violation; dropping the connection", "err", err)
			return err
		}
	}
}

// dispatch routes one frame. It never blocks: work happens in handlers, and
// stdin goes to a per-exec buffered queue.
func (c *conn) dispatch(m *agentproto.Msg, payload []byte) error {
	if m.ID == 0 {
		c.replyErr(0, fmt.Errorf("%s request with id 0: id 0 is reserved for the guest's hello; use a non-zero id: %w", m.Kind, errdefs.ErrInvalidArgument))
		return nil
	}
	switch m.Kind {
	case agentproto.KindHello:
		// Answered inline: it never blocks, and after a snapshot resume it
		// is the first message, whose latency is the resume's.
		h := c.srv.hello()
		h.LastID = c.lastID.Load()
		c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindHello, Hello: &h}, nil)
	case agentproto.KindPing:
		c.spawn(func() {
			h := c.srv.hello()
			c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindPong, Hello: &h}, nil)
		})
	case agentproto.KindSession:
		c.session.Store(true)
		c.replyOK(m.ID)
	case agentproto.KindExec:
		if m.Exec != nil && m.Exec.Detach {
			c.spawn(func() { c.startJob(m) })
			return nil
		}
		c.startExec(m)
	case agentproto.KindJobRead, agentproto.KindJobWait:
		c.spawn(func() { c.jobRead(m) })
	case agentproto.KindJobKill:
		c.spawn(func() { c.jobKill(m) })
	case agentproto.KindJobList:
		c.spawn(func() { c.jobList(m) })
	case agentproto.KindPutFile:
		c.startPut(m)
	case agentproto.KindFileChunk:
		return c.routePut(m, payload)
	case agentproto.KindPortOpen:
		c.startPort(m)
	case agentproto.KindPortData, agentproto.KindPortAck, agentproto.KindPortClose:
		return c.routePort(m, payload)
	case agentproto.KindStdin:
		return c.routeStdin(m, payload)
	case agentproto.KindSignal:
		c.signalExec(m)
	case agentproto.KindCopyOut:
		c.spawn(func() { c.copyOut(m) })
	case agentproto.KindConfigureNet:
		c.spawn(func() { c.configureNet(m) })
	case agentproto.KindSyncClock:
		c.spawn(func() { c.syncClock(m) })
	case agentproto.KindSetHostname:
		c.spawn(func() { c.setHostname(m) })
	case agentproto.KindAddEntropy:
		c.spawn(func() { c.addEntropy(m, payload) })
	case agentproto.KindSetBootID:
		c.spawn(func() { c.setBootID(m) })
	case agentproto.KindSettle:
		c.spawn(func() {
			c.srv.opts.Cgroups.settle()
			c.srv.readyStub(c.reap)
			c.replyOK(m.ID)
		})
	case agentproto.KindHalt:
		c.spawn(func() { c.halt(m) })
	case agentproto.KindMount:
		c.spawn(func() { c.mountRoot(m) })
	case agentproto.KindFreeze, agentproto.KindThaw:
		c.startFreezeCall(m)
	case agentproto.KindWorkspaceChanges:
		c.spawn(func() { c.workspaceChanges(m) })
	default:
		c.replyErr(m.ID, fmt.Errorf("unknown message kind %q (agent protocol version %d): %w", m.Kind, ProtoVersion(), errdefs.ErrNotSupported))
	}
	return nil
}

func (c *conn) halt(m *agentproto.Msg) {
	if m.Sync && c.srv.opts.System != nil {
		if err := c.srv.opts.System.SyncDisks(); err != nil {
			c.log.Error("halt: syncing disks failed", "err", err)
			c.replyErr(m.ID, fmt.Errorf("halt: syncing disks: %w", err))
			return
		}
	}
	c.log.Info("halt requested")
	c.replyOK(m.ID)
	c.haltOnce.Do(func() { close(c.halted) })
}
