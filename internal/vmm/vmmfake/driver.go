// Package vmmfake is an in-memory [vmm.Driver] for tests. A [Machine] is no
// process: it is the real guest agent (internal/agent) serving the agent
// channel from inside the test binary, over a unix socket pair, with a
// recording [agent.System] underneath. An exec runs a host program, so the
// guest's file system is the host's; everything else a guest does to its
// machine (hostname, clock, network, entropy, disk sync) is recorded, not
// done. There is no kernel: the kernel, initramfs and disk paths of a Config
// must exist, and nothing reads them.
//
// The Driver also implements [vmm.Restorer] and its Machines
// [vmm.Snapshotter], so the core's warm path runs on it: a snapshot is one
// small JSON file; a restored Machine is a fresh agent that, like a resumed
// guest, sends no Hello of its own and answers the host's.
//
// Seams for tests: [Config] sets a boot delay, guests that never boot, a
// boot error in the Hello, failing starts, snapshots and restores, and a
// hook that sees every request; [Machine.Crash] makes a guest die at any
// moment.
//
// Lifecycle as [vmm] describes it: Start returns a running Machine; a Halt
// from the host powers it off (Wait gives nil); Kill and Crash end it with
// an error. Wait returns once the agent has stopped and killed the
// processes it started. Pid is 0: no process exists that `isopod vm gc`
// could find or kill.
package vmmfake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Name and Version are what [Driver.Info] reports.
const (
	Name    = "vmmfake"
	Version = "1"
)

// Config configures a [Driver]. The zero value is a driver whose guests boot
// at once and succeed at everything.
type Config struct {
	// Accel is the acceleration machines report (default tcg); nothing is
	// emulated either way.
	Accel vmm.Accel
	// BootDelay is how long a cold-booted guest takes to send its Hello.
	// A restored guest answers at once.
	BootDelay time.Duration
	// BootError is put in a cold-booted guest's Hello, as a guest that could
	// not assemble its root reports it. A snapshot keeps it.
	BootError string
	// ReapDelay is how long a machine that stopped takes to be gone
	// (Done, Wait), as a killed VMM's process takes to be reaped.
	ReapDelay time.Duration
	// FailStart, FailSnapshot and FailRestore, when set, are asked before
	// every start, snapshot or restore; a non-nil error fails it.
	FailStart    func(cfg vmm.Config) error
	FailSnapshot func(m *Machine, dir string) error
	FailRestore  func(cfg vmm.Config, dir string) error
	// FailResize, when set, is asked before every ResizeDisk.
	FailResize func(m *Machine, disk int) error
	// Hang, when set, is asked before every start (not restore); a guest
	// whose config it reports true for never sends its Hello, as one
	// whose kernel never boots, and runs until it is killed.
	Hang func(cfg vmm.Config) bool
	// OnRequest is called with the header of every frame the host sends,
	// before the agent sees it, on the machine's reading goroutine: it
	// must not block. It may call [Machine.Crash]; the frame is then never
	// delivered.
	OnRequest func(m *Machine, msg *agentproto.Msg)
	// AccelVerdict is what [Driver.AccelVerdict] reports (zero: nothing
	// rules acceleration out, no probe yet). Machine is what
	// [Driver.Machine] reports besides the fake's Info (zero: the fake's
	// own machine); MachineError, when set, what it fails with.
	AccelVerdict vmm.AccelVerdict
	Machine      vmm.MachineInfo
	MachineError error
	// Logger receives the driver's decisions; nil discards. The guest's
	// own lines go to each Config.SerialLog, as a console would.
	Logger *slog.Logger
}

// Validate checks the config.
func (c *Config) Validate() error {
	switch {
	case c.Accel != vmm.AccelAuto && c.Accel != vmm.AccelKVM && c.Accel != vmm.AccelTCG:
		return fmt.Errorf("vmmfake config: accel %q: %w", c.Accel, errdefs.ErrInvalidArgument)
	case c.BootDelay < 0:
		return fmt.Errorf("vmmfake config: negative boot delay: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Driver starts fake machines. It is safe for concurrent use.
type Driver struct {
	cfg   Config
	accel vmm.Accel
	log   *slog.Logger

	mu       sync.Mutex // guards following
	machines []*Machine
}

var (
	_ vmm.Driver   = (*Driver)(nil)
	_ vmm.Restorer = (*Driver)(nil)
	_ vmm.Prober   = (*Driver)(nil)
)

// New returns a Driver.
func New(cfg Config) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	accel := cfg.Accel
	if accel == vmm.AccelAuto {
		accel = vmm.AccelTCG
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Driver{cfg: cfg, accel: accel, log: log}, nil
}

// Info reports the fake.
func (d *Driver) Info(ctx context.Context) (vmm.Info, error) {
	return vmm.Info{Name: Name, Version: Version}, nil
}

// AccelVerdict reports Config.AccelVerdict.
func (d *Driver) AccelVerdict(ctx context.Context) vmm.AccelVerdict {
	return d.cfg.AccelVerdict
}

// Machine reports Config.Machine, else the fake's machine, which has no
// firmware; or Config.MachineError.
func (d *Driver) Machine(ctx context.Context) (vmm.MachineInfo, error) {
	info, _ := d.Info(ctx)
	if d.cfg.MachineError != nil {
		return vmm.MachineInfo{Info: info}, d.cfg.MachineError
	}
	if m := d.cfg.Machine; m.Options != "" {
		m.Info = info
		return m, nil
	}
	return vmm.MachineInfo{Info: info, Options: Name,
		Why: "The fake runs the guest agent inside the test process, with no machine or firmware."}, nil
}

// Machines returns every machine started or restored so far, oldest first.
func (d *Driver) Machines() []*Machine {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]*Machine(nil), d.machines...)
}

// Start boots a guest: after Config.BootDelay its agent sends Hello.
func (d *Driver) Start(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) {
	if err := d.check(ctx, &cfg); err != nil {
		return nil, err
	}
	if cfg.Paused {
		return nil, fmt.Errorf("vmmfake: start: only a restore can come up paused: %w", errdefs.ErrInvalidArgument)
	}
	if d.cfg.FailStart != nil {
		if err := d.cfg.FailStart(cfg); err != nil {
			return nil, fmt.Errorf("vmmfake: start: %w", err)
		}
	}
	hang := d.cfg.Hang != nil && d.cfg.Hang(cfg)
	return d.launch(cfg, guest{delay: d.cfg.BootDelay, bootError: d.cfg.BootError, hang: hang})
}

// check validates cfg and turns missing inputs into errors, as a real
// driver does before it starts anything.
func (d *Driver) check(ctx context.Context, cfg *vmm.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("vmmfake: start-up: %w: %w", errdefs.ErrUnavailable, err)
	}
	paths := []string{cfg.Kernel}
	if cfg.Initrd != "" {
		paths = append(paths, cfg.Initrd)
	}
	for _, disk := range cfg.Disks {
		paths = append(paths, disk.Path)
	}
	for _, p := range paths {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("vmmfake: %s is not readable (%v): %w", p, errors.Unwrap(err), errdefs.ErrNotFound)
		}
	}
	if st, err := os.Stat(cfg.Dir); err != nil || !st.IsDir() {
		return fmt.Errorf("vmmfake: vm dir %s must exist: %w", cfg.Dir, errdefs.ErrNotFound)
	}
	return nil
}

func (d *Driver) launch(cfg vmm.Config, g guest) (*Machine, error) {
	m, err := newMachine(d, cfg, g)
	if err != nil {
		return nil, err
	}
	d.mu.Lock()
	d.machines = append(d.machines, m)
	d.mu.Unlock()
	d.log.Debug("vmmfake: machine started", "vm", cfg.ID, "restored", g.restored)
	return m, nil
}

// SnapshotIdentity names the fake and its acceleration.
func (d *Driver) SnapshotIdentity(ctx context.Context) (vmm.SnapshotIdentity, error) {
	return vmm.SnapshotIdentity{VMM: Name + " " + Version, Accel: d.accel}, nil
}

// snapshotFile is the one file of a fake snapshot.
const snapshotFile = "vmmfake-snapshot.json"

// snapshotFormat versions snapshotMeta.
const snapshotFormat = 1

// snapshotMeta is what a restore must match and what the restored guest
// starts from.
type snapshotMeta struct {
	Format    int       `json:"format"`
	Accel     vmm.Accel `json:"accel"`
	VCPUs     int       `json:"vcpus"`
	MemMiB    int       `json:"mem_mib"`
	Disks     int       `json:"disks"`
	NIC       bool      `json:"nic"`
	BootError string    `json:"boot_error,omitempty"`
	State     State     `json:"state"`
}

// readSnapshot reads the snapshot in dir.
func readSnapshot(dir string) (*snapshotMeta, error) {
	b, err := os.ReadFile(filepath.Join(dir, snapshotFile))
	if err != nil {
		return nil, fmt.Errorf("%s is not a snapshot (%v): %w", dir, errors.Unwrap(err), errdefs.ErrNotFound)
	}
	var meta snapshotMeta
	if err := json.Unmarshal(b, &meta); err != nil {
		return nil, fmt.Errorf("%s: %w: %w", snapshotFile, err, errdefs.ErrFailedPrecondition)
	}
	return &meta, nil
}

// SnapshotState is what the guest of the snapshot in dir had recorded
// when the snapshot was taken: what a guest restored from it starts from.
func SnapshotState(dir string) (State, error) {
	meta, err := readSnapshot(dir)
	if err != nil {
		return State{}, err
	}
	return meta.State, nil
}

// Restore starts a machine from the snapshot in dir. cfg must have the
// snapshot's sizes and as many disks and NICs. The guest sends no Hello of
// its own: it was sent before the snapshot; it answers the host's.
func (d *Driver) Restore(ctx context.Context, cfg vmm.Config, dir string) (vmm.Machine, error) {
	if err := d.check(ctx, &cfg); err != nil {
		return nil, err
	}
	meta, err := readSnapshot(dir)
	if err != nil {
		return nil, fmt.Errorf("vmmfake restore: %w", err)
	}
	switch {
	case meta.Format != snapshotFormat:
		return nil, fmt.Errorf("vmmfake restore: snapshot format %d, want %d: %w", meta.Format, snapshotFormat, errdefs.ErrFailedPrecondition)
	case cfg.VCPUs != meta.VCPUs || cfg.MemMiB != meta.MemMiB || len(cfg.Disks) != meta.Disks || (cfg.Net != nil) != meta.NIC:
		return nil, fmt.Errorf("vmmfake restore: config (vcpus %d, %d MiB, %d disks, nic %v) differs from the snapshot's (vcpus %d, %d MiB, %d disks, nic %v): %w",
			cfg.VCPUs, cfg.MemMiB, len(cfg.Disks), cfg.Net != nil, meta.VCPUs, meta.MemMiB, meta.Disks, meta.NIC, errdefs.ErrInvalidArgument)
	case cfg.Accel != vmm.AccelAuto && cfg.Accel != meta.Accel:
		return nil, fmt.Errorf("vmmfake restore: snapshot was taken under %s, not %s: %w", meta.Accel, cfg.Accel, errdefs.ErrFailedPrecondition)
	}
	if d.cfg.FailRestore != nil {
		if err := d.cfg.FailRestore(cfg, dir); err != nil {
			return nil, fmt.Errorf("vmmfake restore: %w", err)
		}
	}
	return d.launch(cfg, guest{restored: true, paused: cfg.Paused, bootError: meta.BootError, state: meta.State, accel: meta.Accel})
}
