// Package mcpserver is isopod's MCP front end: a stdio Model Context Protocol
// server (the isopod-mcp binary) exposing the same core as the CLI as tools.
// It adds only argument marshaling, JSON shaping, a progress keepalive,
// periodic VM garbage collection, and the confinement of host paths named
// by tool arguments (see [hostio.Policy]).
//
// stdout carries only the protocol; every log line goes to stderr.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/admission"
	"isopod/internal/hostio"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/vmrecord"
)

// Defaults of a Server.
const (
	// DefaultBase is the base a sandbox_run boots when the call names none.
	DefaultBase = "base-debian"
	// DefaultProgressInterval is how often a run with a progress token sends
	// a keepalive notification.
	DefaultProgressInterval = 5 * time.Second
	// DefaultGCEvery is how many sandbox_run calls pass between VM GCs.
	DefaultGCEvery = 20
	// DefaultGCKeepLast is how many VM records a GC keeps.
	DefaultGCKeepLast = 20
)

// Core is what the server needs from the sandbox and the stage store;
// core implements it.
type Core interface {
	Run(ctx context.Context, req sandbox.Request) (*report.Run, error)
	StageList(ctx context.Context) (*stages.StageListResult, error)
	StageInfo(ctx context.Context, ref string) (*stages.StageInfoResult, error)
	StageRemove(ctx context.Context, ref string) (*stages.StageRemoveResult, error)
	VMList(ctx context.Context) (*vmrecord.VMListResult, error)
	VMGC(ctx context.Context, keepLast int) (*report.VMGC, error)
	ImageList(ctx context.Context) (*stages.ImageListResult, error)
}

var _ Core = core{}

// core is the Core a server's main wires: runs and VM GC are the
// sandbox's, stages and bases their store's, the VM listing the records'.
type core struct {
	*runCore
	*stageStore
	vmRecords
}

type (
	runCore    = sandbox.Service
	stageStore = stages.Service
	vmRecords  = vmrecord.Records
)

// Config configures a Server.
type Config struct {
	Core    Core // required
	HostIO  hostio.Policy
	Logger  *slog.Logger // nil: discard
	Version string       // reported to clients; "" means "dev"

	ProgressInterval time.Duration // 0: DefaultProgressInterval
	GCEvery          int           // 0: DefaultGCEvery; <0: never after runs
	GCKeepLast       int           // 0: DefaultGCKeepLast
	// NoStartupGC skips the VM GC a server runs when it starts.
	NoStartupGC bool

	// Admission, when set, bounds the VMs sandbox_run starts: a call waits
	// in its queue or is refused as busy (nil: no bound).
	Admission *admission.Admission
	// Remote: the server answers on a network listener, where every call
	// carries a bearer token and the token's roles decide which tools it
	// may call (tokens.go).
	Remote bool
	// StageRegistry, REGISTRY/REPOSITORY, is where a stage a call names but
	// this host lacks is pulled from (stagereg.go); empty: nowhere.
	StageRegistry string
	// PushCommits pushes every stage a sandbox_run commits to
	// StageRegistry, by id and by label.
	PushCommits bool
	// Sessions, when set, is where the session tools keep their sessions
	// (sessions.go); nil: they answer that this server keeps none.
	Sessions *SessionConfig
}

// Validate checks what a Server cannot do without.
func (c *Config) Validate() error {
	if c.Core == nil {
		return errors.New("mcpserver: config has no Core")
	}
	if c.ProgressInterval < 0 || c.GCKeepLast < 0 {
		return errors.New("mcpserver: negative ProgressInterval or GCKeepLast")
	}
	if c.PushCommits && c.StageRegistry == "" {
		return errors.New("mcpserver: PushCommits without a StageRegistry")
	}
	return nil
}

// Server is one MCP server over a Core.
type Server struct {
	cfg  Config
	log  *slog.Logger
	mcp  *mcp.Server
	runs atomic.Int64 // sandbox_run attempts, for periodic GC

	// life bounds every VM the server starts: Close cancels it, so a run
	// never outlives the server even if the session ends mid-call.
	life   context.Context
	cancel context.CancelFunc
	mu     sync.Mutex // guards closed, stopping and wg.Add against Close
	closed bool
	wg     sync.WaitGroup
	// stopping are told, before the runs are cancelled, that the server
	// stops: each answers its calls in flight with codeShuttingDown.
	stopping []func()
	gates    []*gate // of the HTTP handlers made

	pulls flights // stage pulls in progress, one per stage
}

// New builds a Server with every tool registered.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = DefaultProgressInterval
	}
	if cfg.GCEvery == 0 {
		cfg.GCEvery = DefaultGCEvery
	}
	if cfg.GCKeepLast == 0 {
		cfg.GCKeepLast = DefaultGCKeepLast
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, log: log}
	s.life, s.cancel = context.WithCancel(context.Background())
	// The SDK narrates every session event; keep that for debug logging.
	var sdkLog *slog.Logger
	if log.Enabled(context.Background(), slog.LevelDebug) {
		sdkLog = log.With("component", "mcp-sdk")
	}
	s.mcp = mcp.NewServer(&mcp.Implementation{
		Name:    "isopod",
		Title:   "isopod microVM sandbox",
		Version: cfg.Version,
	}, &mcp.ServerOptions{
		Instructions: instructions,
		Logger:       sdkLog,
		Capabilities: &mcp.ServerCapabilities{Tools: &mcp.ToolCapabilities{}},
	})
	s.mcp.AddReceivingMiddleware(startedCalls)
	s.addTools()
	return s, nil
}

// startedCalls tells an HTTP call's stream that the SDK took the call (so
// that it answers with an event stream, which may start at once).
func startedCalls(next mcp.MethodHandler) mcp.MethodHandler {
	return func(ctx context.Context, method string, req mcp.Request) (mcp.Result, error) {
		if c := httpCallFrom(ctx); c != nil && c.stream != nil {
			c.stream.start()
		}
		return next(ctx, method, req)
	}
}

// MCP returns the underlying SDK server (for in-process transports).
func (s *Server) MCP() *mcp.Server { return s.mcp }

// Run starts the start-up GC and serves one session over t until it ends
// or ctx is cancelled. Cancelling ctx (the process was told to stop)
// answers every call in flight with a JSON-RPC error saying so (on a
// StdioTransport) and cancels every run at once: the SDK's session close
// waits for the handlers, which end only when their runs do. Run returns
// once they have, their VMs torn down by the core.
func (s *Server) Run(ctx context.Context, t mcp.Transport) error {
	defer s.Close()
	if st, ok := t.(*StdioTransport); ok {
		s.onStop(st.shutdown)
	}
	// The session ends only after the calls were answered.
	sctx, end := context.WithCancel(context.WithoutCancel(ctx))
	defer end()
	stop := context.AfterFunc(ctx, func() {
		s.shutdown()
		end()
	})
	defer stop()
	if !s.cfg.NoStartupGC {
		s.gcAsync("startup")
	}
	err := s.mcp.Run(sctx, t)
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		err = nil
	}
	return err
}

// onStop registers f to be called when the server stops, before the runs
// are cancelled.
func (s *Server) onStop(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stopping = append(s.stopping, f)
}

// shutdown answers the calls in flight that the server stops, then
// cancels every run.
func (s *Server) shutdown() {
	s.mu.Lock()
	stopping := s.stopping
	s.mu.Unlock()
	for _, f := range stopping {
		f()
	}
	s.cancel()
}

// Close cancels every run in flight (their VMs are torn down by the core)
// and waits for them and for any GC to return.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// track runs fn's context under the server's lifetime: the returned context
// ends when either ctx or the server ends. done must be called when the work
// returns.
func (s *Server) track(ctx context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(ctx)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		cancel()
		return ctx, func() {}
	}
	s.wg.Add(1)
	stop := context.AfterFunc(s.life, cancel)
	return ctx, func() {
		stop()
		cancel()
		s.wg.Done()
	}
}

// gcAsync runs one VM GC in the background; failures are only logged.
func (s *Server) gcAsync(why string) {
	ctx, done := s.track(s.life)
	go func() {
		defer done()
		res, err := s.cfg.Core.VMGC(ctx, s.cfg.GCKeepLast)
		if err != nil {
			s.log.Warn("vm gc failed", "why", why, "err", err)
			return
		}
		s.log.Info("vm gc", "why", why, "removed", len(res.Removed), "kept", res.Kept,
			"killed_vmms", len(res.KilledVMMs), "freed_bytes", res.FreedBytes)
	}()
}

// countRun counts one sandbox_run attempt and starts a GC every GCEvery.
func (s *Server) countRun() {
	n := s.runs.Add(1)
	if s.cfg.GCEvery > 0 && n%int64(s.cfg.GCEvery) == 0 {
		s.gcAsync(fmt.Sprintf("after %d runs", n))
	}
}

// instructions tell a client what the server is for (kept under 2 KiB).
const instructions = `isopod runs shell commands in throwaway microVMs (a real Linux kernel per call), so untrusted code, package installs and experiments never touch this machine.

Use sandbox_run for anything you would not run on the host: it boots a fresh VM, runs cmd with /bin/sh -c, returns exit code, stdout, stderr and timings as JSON, and destroys the VM. A non-zero exit_code is a normal result, not a tool error.

Nothing persists unless you ask: commit_as="<project>/<purpose>" saves the filesystem changes as a stage (only when the command exits 0); later runs with stage="<project>/<purpose>" fork it. Stages are immutable; fork as often as you like. Chain setup steps with && (or run pipelines under bash -o pipefail -c) so a failed step is not committed.

Networking is on by default (NAT). network=false removes the NIC; allow_hosts=["pypi.org","*.pythonhosted.org"] allows only those hosts (allow_cidrs, networks); allow_hosts=[] or allow_cidrs=[] alone denies everything and records what was attempted.

stdin_file, copy_out and workspace name files on the server's host and are confined to its host-I/O root (off on a network listener unless its operator allowed them); stdin (text in) and read_files (guest files back in the result) need no host path.

For state across calls (a dev server that later commands query, an interpreter or build kept warm, a long build then quick iterations) use a session: session_start (sandbox_run's VM arguments), session_exec (background=true for a server; session_job reads it); session_stop every session when done. Otherwise prefer sandbox_run.

Other tools: stage_list, stage_info, stage_rm, vm_list, vm_gc, image_list (which bases are built), session_list, session_pause/resume/fork/commit.

Parallel sandbox_run calls batched in one message may run one after another; use separate agents for real concurrency.`
