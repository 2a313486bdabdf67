package vmmfake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agent"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Errors a machine ends with.
var (
	// ErrKilled is what Wait returns after Kill.
	ErrKilled = errors.New("vmmfake: machine killed")
	// ErrCrashed is what Wait returns after Crash(nil).
	ErrCrashed = errors.New("vmmfake: guest crashed")
)

// guest is how one machine's guest starts.
type guest struct {
	delay     time.Duration // before the Hello of a cold boot
	hang      bool          // never boots: no Hello, ever
	bootError string
	restored  bool      // resumed from a snapshot: no Hello of its own
	paused    bool      // restored paused: nothing runs until Resume
	state     State     // the snapshot's recorded state
	accel     vmm.Accel // the snapshot's; "" for the driver's
}

// Machine is one fake guest: the agent serving the channel's guest end in
// a goroutine of this process. It implements [vmm.Machine], [vmm.Timing]
// and [vmm.Snapshotter].
type Machine struct {
	drv     *Driver
	cfg     vmm.Config
	accel   vmm.Accel
	g       guest
	started time.Time
	host    net.Conn // the channel's host end, returned by Agent
	guest   net.Conn // the agent's end
	sys     *System
	serial  *consoleWriter // the console, as the guest writes it
	console *slog.Logger   // the agent's lines on serial

	ctx    context.Context // the agent's; cancelled when the machine stops
	cancel context.CancelFunc

	pmu        sync.Mutex
	unpause    chan struct{} // non-nil while a Snapshot holds the guest; Resume closes it
	resumeOnce sync.Once
	resumed    chan struct{} // closed by Resume (at once unless restored paused)
	exitOnce   sync.Once
	err        error         // set before stopped is closed
	stopped    chan struct{} // closed when the machine stops (power-off, Kill, Crash)
	served     chan struct{} // closed when the agent goroutine has returned
	srv        atomic.Pointer[agent.Server]
	done       chan struct{} // closed when stopped and served
	resized    map[int]int64 // ResizeDisk's disks and sizes, under pmu
}

var (
	_ vmm.Machine     = (*Machine)(nil)
	_ vmm.Timing      = (*Machine)(nil)
	_ vmm.Snapshotter = (*Machine)(nil)
	_ vmm.Resumer     = (*Machine)(nil)
	_ vmm.DiskResizer = (*Machine)(nil)
)

func newMachine(d *Driver, cfg vmm.Config, g guest) (*Machine, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("vmmfake: socketpair: %w", err)
	}
	host, err := fileConn(fds[0], "vmmfake-host")
	if err != nil {
		unix.Close(fds[1])
		return nil, err
	}
	gconn, err := fileConn(fds[1], "vmmfake-guest")
	if err != nil {
		host.Close()
		return nil, err
	}
	console := &consoleWriter{w: io.Discard}
	if cfg.SerialLog != nil {
		console.w = cfg.SerialLog
	}
	accel := g.accel
	if accel == "" {
		accel = d.accel
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Machine{
		drv: d, cfg: cfg, accel: accel, g: g, started: time.Now(),
		host: host, guest: gconn,
		sys:     newSystem(g.state, cfg.Cmdline),
		serial:  console,
		console: agent.NewConsoleLogger(console, cmdlineValue(cfg.Cmdline, agentproto.CmdlineDebug) == "1"),
		ctx:     ctx, cancel: cancel,
		resumed: make(chan struct{}),
		stopped: make(chan struct{}),
		served:  make(chan struct{}),
		done:    make(chan struct{}),
	}
	if !g.paused {
		m.resumeOnce.Do(func() { close(m.resumed) })
	}
	go m.run()
	return m, nil
}

// Resume lets a machine restored paused, or paused by Snapshot, run.
func (m *Machine) Resume(ctx context.Context) error {
	m.resumeOnce.Do(func() { close(m.resumed) })
	m.pmu.Lock()
	if m.unpause != nil {
		close(m.unpause)
		m.unpause = nil
	}
	m.pmu.Unlock()
	return nil
}

// fileConn turns one socket of a pair into a net.Conn.
func fileConn(fd int, name string) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), name)
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("vmmfake: socket conn: %w", err)
	}
	return c, nil
}

// cmdlineValue is the value of key=value on a kernel command line.
func cmdlineValue(cmdline, key string) string {
	for _, f := range strings.Fields(cmdline) {
		if k, v, ok := strings.Cut(f, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// run is the guest: it boots (waits out the delay), serves the channel, and
// powers off when the host halts it. When the channel ends otherwise the
// guest idles until the machine is ended.
func (m *Machine) run() {
	defer close(m.served)
	select {
	case <-m.resumed:
	case <-m.stopped:
		return
	}
	if m.g.hang {
		<-m.stopped
		return
	}
	if m.g.delay > 0 {
		t := time.NewTimer(m.g.delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-m.stopped:
			return
		}
	}
	m.console.Info("vmmfake guest up", "vm", m.cfg.ID, "restored", m.g.restored)
	srv := agent.NewServer(agent.Options{Logger: m.console, System: m.sys, Hello: m.hello})
	m.srv.Store(srv)
	err := srv.Serve(m.ctx, &channel{m: m, dropHello: m.g.restored})
	if err == nil {
		m.console.Info("vmmfake guest powered off")
		m.exit(nil)
		return
	}
	m.console.Debug("vmmfake guest: channel ended", "err", err)
}

func (m *Machine) hello() agentproto.Hello {
	h := agent.DefaultHello()
	h.BootError = m.g.bootError
	return h
}

// exit stops the machine with err (nil: a power-off). The first call wins.
func (m *Machine) exit(err error) {
	m.exitOnce.Do(func() {
		m.err = err
		m.serial.stop()
		close(m.stopped)
		m.cancel()
		m.guest.Close()
		go func() {
			<-m.served
			// The guest's background jobs end with the machine, as in a
			// real VM.
			if srv := m.srv.Load(); srv != nil {
				srv.KillAll()
			}
			time.Sleep(m.drv.cfg.ReapDelay)
			close(m.done)
		}()
	})
}

// Agent is the host end of the agent channel (a *net.UnixConn). The caller
// closes it; closing it does not stop the machine.
func (m *Machine) Agent() io.ReadWriteCloser { return m.host }

// Pid is 0: a fake machine has no process of its own, and nothing must
// mistake another process for it.
func (m *Machine) Pid() int { return 0 }

// StartTime is 0, as Pid.
func (m *Machine) StartTime() uint64 { return 0 }

// Started is when the machine was started.
func (m *Machine) Started() time.Time { return m.started }

// Accel is the acceleration the machine reports.
func (m *Machine) Accel() vmm.Accel { return m.accel }

// Wait blocks until the machine has stopped and its agent has ended every
// process it started. It gives nil after a power-off (the host's Halt) and
// every caller the same error.
func (m *Machine) Wait() error {
	<-m.done
	return m.err
}

// Done is closed when Wait would return.
func (m *Machine) Done() <-chan struct{} { return m.done }

// Kill stops the machine at once: the agent's processes are killed and the
// channel's guest end closed. Idempotent; it does not wait.
func (m *Machine) Kill() error {
	m.exit(ErrKilled)
	return nil
}

// Crash makes the guest die as a hostile or broken guest would: err's text
// (a kernel's last words, say) is the console's last line, the channel
// closes under the host, and the machine stops with err (ErrCrashed when
// nil). Safe from any goroutine, OnRequest included.
func (m *Machine) Crash(err error) {
	if err == nil {
		err = ErrCrashed
	}
	io.WriteString(m.serial, err.Error()+"\n")
	m.exit(err)
}

// Config is the configuration the machine was started with.
func (m *Machine) Config() vmm.Config { return m.cfg }

// Restored reports whether the machine was restored from a snapshot.
func (m *Machine) Restored() bool { return m.g.restored }

// State is what the guest's machine operations have recorded so far.
func (m *Machine) State() State { return m.sys.State() }

// ResizeDisk cuts or grows disk i's file to bytes.
func (m *Machine) ResizeDisk(ctx context.Context, i int, bytes int64) error {
	if i < 0 || i >= len(m.cfg.Disks) || bytes < 0 {
		return fmt.Errorf("vmmfake: resizing disk %d of %d to %d bytes: %w", i, len(m.cfg.Disks), bytes, errdefs.ErrInvalidArgument)
	}
	if m.cfg.Disks[i].ReadOnly {
		return fmt.Errorf("vmmfake: disk %d is read-only and keeps its size: %w", i, errdefs.ErrInvalidArgument)
	}
	if f := m.drv.cfg.FailResize; f != nil {
		if err := f(m, i); err != nil {
			return fmt.Errorf("vmmfake: resizing disk %d: %w", i, err)
		}
	}
	if err := os.Truncate(m.cfg.Disks[i].Path, bytes); err != nil {
		return fmt.Errorf("vmmfake: resizing disk %d: %w", i, err)
	}
	m.pmu.Lock()
	defer m.pmu.Unlock()
	if m.resized == nil {
		m.resized = map[int]int64{}
	}
	m.resized[i] = bytes
	return nil
}

// Resized is each disk ResizeDisk resized, by its index in the config,
// and its last size.
func (m *Machine) Resized() map[int]int64 {
	m.pmu.Lock()
	defer m.pmu.Unlock()
	return maps.Clone(m.resized)
}

// Snapshot pauses the guest (requests are no longer delivered, nothing more
// is sent) and writes the snapshot into dir. The machine stays paused until
// Resume; the caller kills it or resumes it. As with QEMU, a restored machine can be snapshotted
// again only with RAM of its own (vmm.Config.OwnRAM and RAMFile).
func (m *Machine) Snapshot(ctx context.Context, dir string) error {
	if m.g.restored && !(m.cfg.OwnRAM && m.cfg.RAMFile != "") {
		return fmt.Errorf("vmmfake snapshot: a restored machine cannot be snapshotted again: %w", errdefs.ErrNotSupported)
	}
	select {
	case <-m.stopped:
		return fmt.Errorf("vmmfake snapshot: the machine has stopped: %w", errdefs.ErrFailedPrecondition)
	default:
	}
	if f := m.drv.cfg.FailSnapshot; f != nil {
		if err := f(m, dir); err != nil {
			return fmt.Errorf("vmmfake snapshot: %w", err)
		}
	}
	m.pmu.Lock()
	if m.unpause == nil {
		m.unpause = make(chan struct{})
	}
	m.pmu.Unlock()
	meta := snapshotMeta{
		Format: snapshotFormat, Accel: m.accel,
		VCPUs: m.cfg.VCPUs, MemMiB: m.cfg.MemMiB, Disks: len(m.cfg.Disks), NIC: m.cfg.Net != nil,
		BootError: m.g.bootError, State: m.State(),
	}
	b, err := json.MarshalIndent(meta, "", "  ")
	if err != nil {
		return fmt.Errorf("vmmfake snapshot: %w", err)
	}
	f, err := os.OpenFile(filepath.Join(dir, snapshotFile), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("vmmfake snapshot: %w", err)
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("vmmfake snapshot: %w", err)
	}
	return nil
}

// consoleWriter serialises the console's writers (the agent's logger and
// Crash) and drops what a stopped guest would never have written.
type consoleWriter struct {
	mu      sync.Mutex // guards following
	w       io.Writer
	stopped bool
}

func (c *consoleWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.stopped {
		return len(p), nil
	}
	return c.w.Write(p)
}

func (c *consoleWriter) stop() {
	c.mu.Lock()
	c.stopped = true
	c.mu.Unlock()
}

// errStopped ends the agent's reads and writes once the machine stopped.
var errStopped = errors.New("vmmfake: machine stopped")

// holdIfPaused blocks while the machine is paused, until it resumes or
// stops; it returns errStopped once the machine has stopped.
func (m *Machine) holdIfPaused() error {
	for {
		m.pmu.Lock()
		ch := m.unpause
		m.pmu.Unlock()
		if ch == nil {
			select {
			case <-m.stopped:
				return errStopped
			default:
				return nil
			}
		}
		select {
		case <-m.stopped:
			return errStopped
		case <-ch:
		}
	}
}
