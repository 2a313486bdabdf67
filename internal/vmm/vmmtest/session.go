package vmmtest

import (
	"bytes"
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/vmm"
)

// Bounds for a guest under TCG on a loaded host.
const (
	bootTimeout = 120 * time.Second
	stepTimeout = 30 * time.Second
)

// Config is a small guest config with a fresh ID and directory.
func Config(t *testing.T, g Guest) vmm.Config {
	t.Helper()
	return vmm.Config{
		ID:      "t" + strconv.FormatInt(time.Now().UnixNano()%1e12, 36),
		Dir:     t.TempDir(),
		Kernel:  g.Kernel,
		Initrd:  g.Initrd,
		Cmdline: "panic=-1",
		VCPUs:   1,
		MemMiB:  256,
	}
}

// Session is a started machine and an agent client on its channel.
type Session struct {
	M      vmm.Machine
	Cfg    vmm.Config
	Serial *SyncBuffer
	Client *agentclient.Client
	Hello  agentproto.Hello
	// Boot is the time from the VMM's start to the agent's Hello.
	Boot time.Duration

	began time.Time
}

// Boot starts cfg (with a console buffer) and waits for the agent's Hello.
// The machine is killed and waited for, and the client closed, in
// t.Cleanup.
func Boot(t *testing.T, drv vmm.Driver, cfg vmm.Config) *Session {
	t.Helper()
	s := start(t, cfg, func(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) { return drv.Start(ctx, cfg) })
	ctx, cancel := context.WithTimeout(context.Background(), bootTimeout)
	defer cancel()
	h, err := s.Client.WaitHello(ctx)
	s.hello(t, h, err)
	t.Logf("boot to the agent's hello: %v (accel %s)", s.Boot.Round(time.Millisecond), s.M.Accel())
	return s
}

// Restore starts a machine from the snapshot in dir and says Hello, as the
// host must after a resume. Cleanup as for Boot.
func Restore(t *testing.T, drv vmm.Restorer, cfg vmm.Config, dir string) *Session {
	t.Helper()
	s := start(t, cfg, func(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) { return drv.Restore(ctx, cfg, dir) })
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	h, err := s.Client.Hello(ctx)
	s.hello(t, h, err)
	t.Logf("restore to the agent's hello: %v (accel %s)", s.Boot.Round(time.Millisecond), s.M.Accel())
	return s
}

func start(t *testing.T, cfg vmm.Config, fn func(context.Context, vmm.Config) (vmm.Machine, error)) *Session {
	t.Helper()
	s := &Session{Cfg: cfg, Serial: &SyncBuffer{}}
	s.Cfg.SerialLog = s.Serial
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	began := time.Now()
	m, err := fn(ctx, s.Cfg)
	if err != nil {
		t.Fatalf("starting %s: %v", cfg.ID, err)
	}
	if tm, ok := m.(vmm.Timing); ok {
		began = tm.Started()
	}
	s.M = m
	s.Client = agentclient.New(m.Agent(), nil)
	t.Cleanup(func() {
		m.Kill()
		m.Wait()
		s.Client.Close()
	})
	s.began = began
	return s
}

func (s *Session) hello(t *testing.T, h agentproto.Hello, err error) {
	t.Helper()
	s.Boot = time.Since(s.began)
	if err != nil {
		t.Fatalf("agent hello: %v; console:\n%s", err, s.Serial.Tail(3000))
	}
	s.Hello = h
}

// Ping makes one round trip.
func (s *Session) Ping(t *testing.T) {
	t.Helper()
	s.call(t, &agentproto.Msg{Kind: agentproto.KindPing})
}

// Halt asks the guest to sync and power off and waits for its answer.
func (s *Session) Halt(t *testing.T) {
	t.Helper()
	s.call(t, &agentproto.Msg{Kind: agentproto.KindHalt, Sync: true})
}

func (s *Session) call(t *testing.T, m *agentproto.Msg) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	if err := s.Client.Call(ctx, m, nil); err != nil {
		t.Fatalf("%s: %v; console:\n%s", m.Kind, err, s.Serial.Tail(3000))
	}
}

// Exec runs argv in the guest and returns its output and exit code (-1
// when a signal ended it).
func (s *Session) Exec(t *testing.T, argv ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	var o, e bytes.Buffer
	done, err := s.Client.Exec(ctx, agentclient.ExecRequest{
		Exec:   agentproto.Exec{Argv: argv, TimeoutMS: stepTimeout.Milliseconds() / 2},
		Stdout: &o, Stderr: &e,
	})
	if err != nil {
		t.Fatalf("exec %q: %v; console:\n%s", argv, err, s.Serial.Tail(3000))
	}
	code = -1
	if done.ExitCode != nil {
		code = *done.ExitCode
	}
	return o.String(), e.String(), code
}

// SyncBuffer is a bytes.Buffer safe for concurrent writers and readers.
type SyncBuffer struct {
	mu  sync.Mutex // guards following
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n bytes written.
func (b *SyncBuffer) Tail(n int) string {
	s := b.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
