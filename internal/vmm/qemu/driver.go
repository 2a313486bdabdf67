// Package qemu is isopod's [vmm.Driver] for QEMU: one qemu-system-x86_64
// process per guest, machine type microvm with virtio-mmio devices found
// through ACPI, the console on an ISA serial port, and the agent channel on
// a virtio-serial port named [AgentPortName].
//
// The agent channel and the QMP monitor are unix socketpairs whose QEMU ends
// are inherited as file descriptors, so no socket file exists and nothing
// can connect to them but isopod. The console is QEMU's stdout, copied into
// the caller's writer.
//
// Acceleration: KVM when nothing the host says rules it out (the CPU's
// vmx or svm flag, /dev/kvm and whether its mode lets the VMM's ids open
// it) and a one-time probe shows QEMU can boot the kernel with it;
// otherwise TCG, with the host TSC frequency on the kernel command line,
// and the reason logged in sentences. $ISOPOD_ACCEL=kvm|tcg forces one.
//
// The microvm options follow the firmware the binary loads (see
// machine.go): Debian 12's QEMU 7.2 boots microvm with qboot, Debian 13's
// 10.0 with SeaBIOS, which needs option ROMs.
package qemu

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
	"isopod/internal/jail"
	"isopod/internal/knobs"
	"isopod/internal/vmm"
)

// DefaultBinary is the QEMU looked up on PATH when neither Config.Binary nor
// $ISOPOD_QEMU names one.
const DefaultBinary = "qemu-system-x86_64"

// Config configures a Driver.
type Config struct {
	// Binary is the QEMU to run (the front ends take $ISOPOD_QEMU);
	// default DefaultBinary on PATH.
	Binary string
	// Accel, when set, forces an accelerator for every boot (the front
	// ends take $ISOPOD_ACCEL); empty means KVM when it works, else TCG.
	Accel vmm.Accel
	// Logger receives start-up and accel decisions; nil discards.
	Logger *slog.Logger
	// ProbeCache, when set, is a file that remembers the KVM probe's outcome
	// across processes (keyed by QEMU, kernel and host boot), so that only
	// the first isopod call after a boot pays for it.
	ProbeCache string
	// FactsCache, when set, is a file that remembers what the QEMU binary
	// says of itself and the libraries it loads across processes (keyed by
	// the binary and the loader's cache), so that each isopod call does
	// not ask again.
	FactsCache string
	// ProbeTimeout bounds the KVM probe boot; default 3s.
	ProbeTimeout time.Duration
	// Jail, when set, confines every QEMU process (see internal/jail);
	// nil runs them unconfined.
	Jail *jail.Jailer
}

// Validate checks the config.
func (c *Config) Validate() error {
	if c.ProbeCache != "" && !filepath.IsAbs(c.ProbeCache) {
		return fmt.Errorf("qemu config: probe cache %q must be absolute: %w", c.ProbeCache, errdefs.ErrInvalidArgument)
	}
	if c.FactsCache != "" && !filepath.IsAbs(c.FactsCache) {
		return fmt.Errorf("qemu config: facts cache %q must be absolute: %w", c.FactsCache, errdefs.ErrInvalidArgument)
	}
	if c.ProbeTimeout < 0 {
		return fmt.Errorf("qemu config: negative probe timeout: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Driver starts QEMU machines. It is safe for concurrent use.
type Driver struct {
	bin          string
	accel        vmm.Accel // forced for every boot; "" is auto
	log          *slog.Logger
	probeCache   string
	probeTimeout time.Duration

	infoMu sync.Mutex
	info   *vmm.Info

	jail      *jail.Jailer
	jailFiles []string // what a jailed QEMU reads by name
	sealed    sealedCache

	probeMu sync.Mutex
	probed  map[string]error // kernel key -> KVM probe outcome

	machineMu sync.Mutex
	plan      *machinePlan // once probed

	// probes are swapped in tests.
	openKVM      func() error
	kvmFacts     func() kvmFacts
	machineProbe func(ctx context.Context, bin string) (machineFacts, error)
}

var _ vmm.Driver = (*Driver)(nil)

// New resolves the QEMU binary and returns a Driver.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	bin := cfg.Binary
	if bin == "" {
		bin = DefaultBinary
	}
	path, err := hosttool.Find(bin)
	if err != nil {
		return nil, fmt.Errorf("qemu: %w; or set %s to a QEMU binary: %w", err, knobs.QEMU, errdefs.ErrNotFound)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	timeout := cfg.ProbeTimeout
	if timeout == 0 {
		timeout = 3 * time.Second
	}
	cache := factsCache{path: cfg.FactsCache}
	var files []string
	if cfg.Jail != nil {
		if files, err = jailFiles(path, cache); err != nil {
			return nil, err
		}
	}
	return &Driver{
		jail:         cfg.Jail,
		jailFiles:    files,
		bin:          path,
		accel:        cfg.Accel,
		log:          log,
		probeCache:   cfg.ProbeCache,
		probeTimeout: timeout,
		probed:       make(map[string]error),
		openKVM:      openDevKVM,
		kvmFacts:     func() kvmFacts { return readKVMFacts(cfg.Jail) },
		machineProbe: func(ctx context.Context, bin string) (machineFacts, error) {
			return probeMachine(ctx, cache, bin)
		},
	}, nil
}

// Info runs `qemu -version` once and reports the binary.
func (d *Driver) Info(ctx context.Context) (vmm.Info, error) {
	d.infoMu.Lock()
	defer d.infoMu.Unlock()
	if d.info != nil {
		return *d.info, nil
	}
	out, err := exec.CommandContext(ctx, d.bin, "-version").Output()
	if err != nil {
		return vmm.Info{}, fmt.Errorf("qemu: running %s -version: %w", d.bin, err)
	}
	v, err := parseVersion(string(out))
	if err != nil {
		return vmm.Info{}, err
	}
	d.info = &vmm.Info{Name: "qemu", Version: v, Path: d.bin}
	return *d.info, nil
}

// parseVersion finds "version X.Y.Z" in `qemu -version` output.
func parseVersion(out string) (string, error) {
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "version" {
			return f[i+1], nil
		}
	}
	return "", fmt.Errorf("qemu: no version in %q", strings.SplitN(out, "\n", 2)[0])
}

// Start boots a guest. ctx bounds the start-up (the KVM probe, QEMU's
// initialisation and the QMP handshake), never the Machine.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if cfg.Paused {
		return nil, fmt.Errorf("qemu start: only a restore can come up paused: %w", errdefs.ErrInvalidArgument)
	}
	m, err := d.start(ctx, &cfg, launch{})
	if err != nil {
		return nil, err
	}
	return m, nil
}

// start is Start with the snapshot-related launch fields already set in l.
func (d *Driver) start(ctx context.Context, cfg *vmm.Config, l launch) (*Machine, error) {
	if err := checkConfig(cfg); err != nil {
		return nil, err
	}
	if err := checkFiles(cfg); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = d.log
	}
	log = log.With("vm", cfg.ID)
	plan, err := d.machine(ctx)
	if err != nil {
		return nil, err
	}
	l.machine, l.dataDirs = plan.Options, plan.DataDirs
	choice, err := d.chooseAccel(ctx, cfg, l.accel)
	if err != nil {
		return nil, err
	}
	log.Debug("qemu accel", "accel", choice.Accel, "reason", choice.Reason)
	l.accel = choice.Accel
	if l.accel == vmm.AccelTCG {
		l.tscKHz = hostTSCKHz()
	}
	if l.snapshotRAM != "" && d.jail != nil {
		l.romOff = plan.ROMOff
	}
	t0 := time.Now()
	mf, err := d.openFiles(cfg, &l, l.snapshotRAM)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	l.sandbox = d.jail != nil
	m, err := d.spawn(ctx, cfg, l, mf)
	if err != nil {
		return nil, err
	}
	m.log = log
	log.Info("qemu started", "pid", m.proc.pid, "accel", l.accel, "accel_reason", choice.Reason)
	log.Debug("qemu start", "ram", l.ramFrom, "open_files_ms", ms(t1.Sub(t0)), "to_qmp_greeting_ms", ms(time.Since(t1)), "jail_to_exec_ms", ms(m.proc.toExec))
	return m, nil
}

// chooseAccel picks the accelerator: a restore's snapshot decides (its
// accel, which must be usable), else the probes do.
func (d *Driver) chooseAccel(ctx context.Context, cfg *vmm.Config, snapshot vmm.Accel) (accelChoice, error) {
	if snapshot != "" {
		if snapshot == vmm.AccelKVM {
			if why := d.kvmFacts().obstacle(); why != "" {
				return accelChoice{}, fmt.Errorf("qemu: the snapshot was made under kvm, which cannot be used: %s: %w", why, errdefs.ErrFailedPrecondition)
			}
		}
		return accelChoice{snapshot, snapshotReason(snapshot)}, nil
	}
	return selectAccel(ctx, cfg.Accel, accelProbes{
		env:     func() string { return string(d.accel) },
		facts:   d.kvmFacts,
		bootKVM: func(ctx context.Context) error { return d.kvmBoots(ctx, cfg.Kernel) },
	})
}

// spawn starts QEMU (in its jail when there is one) with the machine's
// files and its agent and QMP channels, and greets QMP. On failure
// everything it was given is closed and the process is gone.
func (d *Driver) spawn(ctx context.Context, cfg *vmm.Config, l launch, mf *machineFiles) (*Machine, error) {
	agentHost, agentGuest, err := socketpair()
	if err != nil {
		mf.closeAll()
		return nil, err
	}
	qmpHost, qmpGuest, err := socketpair()
	if err != nil {
		mf.closeAll()
		agentHost.Close()
		agentGuest.Close()
		return nil, err
	}
	ps := procSpec{bin: d.bin, args: buildArgs(cfg, l), extra: append([]*os.File{agentGuest, qmpGuest}, mf.files...), stdout: cfg.SerialLog}
	if d.jail != nil {
		ps.jail, ps.js = d.jail, d.jailSpec(cfg, l.accel, nil)
	}
	p, err := startProc(ps)
	agentGuest.Close()
	qmpGuest.Close()
	mf.closeCopies()
	if err != nil {
		mf.closeAll()
		agentHost.Close()
		qmpHost.Close()
		return nil, fmt.Errorf("qemu: %w", err)
	}
	qmp, err := NewQMPClient(ctx, qmpHost)
	if err != nil {
		mf.closeAll()
		agentHost.Close()
		return nil, startupError(ctx, p, err)
	}
	go func() {
		<-p.done
		qmp.Close()
		mf.closeAll()
	}()
	return &Machine{cfg: *cfg, proc: p, agent: agentHost, qmp: qmp, accel: l.accel, files: mf}, nil
}

// startupError ends a QEMU whose QMP greeting failed and says why, in
// QEMU's own words when it refused its arguments.
func startupError(ctx context.Context, p *proc, err error) error {
	if ctx.Err() == nil {
		// QEMU most likely refused its arguments and is exiting; give it
		// a moment so that its own words make the error.
		select {
		case <-p.done:
		case <-time.After(2 * time.Second):
		}
	}
	p.kill()
	p.wait()
	if ctx.Err() != nil {
		return fmt.Errorf("qemu: start-up: %w: %w", errdefs.ErrUnavailable, err)
	}
	if msg := p.stderr.String(); msg != "" {
		return fmt.Errorf("qemu: start-up failed: %s: %w", msg, errdefs.ErrFailedPrecondition)
	}
	return fmt.Errorf("qemu: start-up failed: %w", err)
}

// checkFiles turns missing inputs into clear errors before QEMU runs.
func checkFiles(cfg *vmm.Config) error {
	check := func(what, path string) error {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("qemu: %s %s is not readable (%v); check the path: %w", what, path, errors.Unwrap(err), errdefs.ErrNotFound)
		}
		return nil
	}
	if err := check("kernel", cfg.Kernel); err != nil {
		return err
	}
	if cfg.Initrd != "" {
		if err := check("initrd", cfg.Initrd); err != nil {
			return err
		}
	}
	for _, disk := range cfg.Disks {
		if err := check("disk", disk.Path); err != nil {
			return err
		}
	}
	if st, err := os.Stat(cfg.Dir); err != nil || !st.IsDir() {
		return fmt.Errorf("qemu: vm dir %s must exist: %w", cfg.Dir, errdefs.ErrNotFound)
	}
	return nil
}

// socketpair returns a connected unix stream pair: the host end as a
// net.Conn and the QEMU end as a file to inherit.
func socketpair() (net.Conn, *os.File, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("qemu: socketpair: %w", err)
	}
	hostFile := os.NewFile(uintptr(fds[0]), "isopod-host")
	guest := os.NewFile(uintptr(fds[1]), "isopod-qemu")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		guest.Close()
		return nil, nil, fmt.Errorf("qemu: socketpair conn: %w", err)
	}
	return host, guest, nil
}

// Machine is one running QEMU process. It implements [vmm.Machine],
// [vmm.Timing] and [vmm.Snapshotter].
type Machine struct {
	cfg   vmm.Config
	proc  *proc
	agent net.Conn
	qmp   *QMPClient
	accel vmm.Accel
	files *machineFiles // guest RAM (booted machines) and what QEMU inherited
	log   *slog.Logger
}

var (
	_ vmm.Machine     = (*Machine)(nil)
	_ vmm.Timing      = (*Machine)(nil)
	_ vmm.Resumer     = (*Machine)(nil)
	_ vmm.DiskResizer = (*Machine)(nil)
)

// Agent is the host end of the agent channel (a *net.UnixConn). The caller
// closes it; closing it does not stop the guest.
func (m *Machine) Agent() io.ReadWriteCloser { return m.agent }

// QMP is the machine's monitor connection.
func (m *Machine) QMP() *QMPClient { return m.qmp }

// Pid is the QEMU process id.
func (m *Machine) Pid() int { return m.proc.pid }

// StartTime is field 22 of /proc/PID/stat, read right after the start.
func (m *Machine) StartTime() uint64 { return m.proc.startTime }

// Started is when the QEMU process was started.
func (m *Machine) Started() time.Time { return m.proc.started }

// Accel is the acceleration QEMU runs the guest with.
func (m *Machine) Accel() vmm.Accel { return m.accel }

// Wait blocks until QEMU has exited and its console output is copied. A
// guest power-off gives nil; every caller gets the same result.
func (m *Machine) Wait() error {
	return m.proc.wait()
}

// Done is closed when QEMU has exited and its output is copied.
func (m *Machine) Done() <-chan struct{} { return m.proc.done }

// Kill sends SIGKILL to QEMU's process group. Idempotent; it does not wait.
func (m *Machine) Kill() error {
	m.proc.kill()
	return nil
}

// ms is d in milliseconds, to a hundredth.
func ms(d time.Duration) float64 { return float64(d.Microseconds()/10) / 100 }
