package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"isopod/internal/errdefs"
	"isopod/internal/jail"
	"isopod/internal/oci"
	"isopod/internal/paths"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// Options configures a Service.
type Options struct {
	Paths  paths.Paths
	Logger *slog.Logger // nil: discard
	Driver vmm.Driver   // nil: the one VMM names
	// VMM names the VMM driver (ISOPOD_VMM; see VMMDrivers); empty:
	// DefaultVMM.
	VMM     string
	Version string // isopod version, recorded in stages and reports
	// AllowBaseSkew lets forks boot over a rebuilt base (ISOPOD_ALLOW_BASE_SKEW=1).
	AllowBaseSkew bool
	// Kernel is a custom guest kernel with every driver built in
	// (--kernel, ISOPOD_KERNEL); empty: the fetched one.
	Kernel string
	// AgentBin is the guest agent for image builds (ISOPOD_AGENT_BIN);
	// empty: next to the running binary, else on PATH.
	AgentBin string
	// QEMU is the VMM binary (ISOPOD_QEMU); empty: qemu-system-x86_64 on PATH.
	QEMU string
	// Accel forces an accelerator (ISOPOD_ACCEL); empty: KVM when usable.
	Accel vmm.Accel
	// Jail says whether the VMM runs inside its jail (ISOPOD_JAIL).
	Jail JailMode
	// DockerConfig is the directory of Docker's config.json, whose
	// credentials image import and stage transfers use (DOCKER_CONFIG,
	// else ~/.docker); empty: anonymous.
	DockerConfig string
	// RegistryStall is how little a registry request may move before it
	// fails as unavailable (ISOPOD_REGISTRY_STALL_S,
	// ISOPOD_REGISTRY_MIN_KIBPS); zero: oci.DefaultStall.
	RegistryStall oci.Stall
	// NoWarmPool makes every run boot cold and builds no snapshot
	// (ISOPOD_WARM_POOL=off).
	NoWarmPool bool
	// WarmPoolBytes is the disk budget of the warm pool's snapshots; the
	// least recently used go first (ISOPOD_WARM_POOL_DISK_MIB). 0: none.
	WarmPoolBytes int64
	// ReadyVMs is how many restored, paused VMs to keep for each hot
	// shape (ready.go); 0: none. For a front end that lives long; it must
	// call Close.
	ReadyVMs int
	// BackgroundSnapshots builds a missing warm-pool snapshot after the
	// run that needed it, which boots cold, instead of inside it. For a
	// front end that lives long; it must call Close.
	BackgroundSnapshots bool
	// HoldVM, when set, takes a place for a VM of memMiB of guest memory
	// that the front end's admission does not see otherwise (a ready VM,
	// a background snapshot build), at once or not at all; release gives
	// it back. Without a place the VM is not made.
	HoldVM func(memMiB int) (release func(), ok bool)
}

// JailMode is whether a VMM runs confined by isopod's jail.
type JailMode uint8

const (
	// JailDefault: the setting is unset, which means JailOn.
	JailDefault JailMode = iota
	// JailOn confines every VMM (ISOPOD_JAIL=1 or on).
	JailOn
	// JailOff runs VMMs unconfined and says so in every run's report
	// (ISOPOD_JAIL=0 or off): see UnconfinedWarning.
	JailOff
)

// UnconfinedWarning is the warning every run's report carries under JailOff.
const UnconfinedWarning = "unconfined: ISOPOD_JAIL=off runs the VMM without its jail"

// jailReport is what a run's report says about the jail.
func (s *Service) jailReport() []string {
	if s.opts.Jail == JailOff {
		return []string{UnconfinedWarning}
	}
	return s.jailWarnings
}

// Service is the core both front ends call. It is safe for concurrent use.
type Service struct {
	opts Options
	log  *slog.Logger

	td   teardownState
	warm *warmpool.Catalog
	// ready holds ready VMs (nil: none); bg runs background snapshot
	// builds.
	ready *readyPool
	bg    *bgWork

	driverOnce sync.Once
	drv        vmm.Driver
	drvErr     error
	// jailer confines the VMMs (nil when off); jailWarnings are what
	// every report says of it on this host. Both set with drv.
	jailer       *jail.Jailer
	jailWarnings []string
}

// driver returns the VMM driver, creating the one Options.VMM selects
// (wiring.go) on first use.
func (s *Service) driver(ctx context.Context) (vmm.Driver, error) {
	s.driverOnce.Do(func() {
		if s.opts.Driver != nil {
			s.drv = s.opts.Driver
			return
		}
		var j *jail.Jailer
		if s.opts.Jail != JailOff {
			var err error
			if j, err = jail.New(jail.Config{Logger: s.log, Scope: s.opts.Paths.Scope()}); err != nil {
				s.drvErr = err
				return
			}
			s.jailer = j
			s.jailWarnings = j.Warnings()
		}
		s.drv, s.drvErr = s.newDriver(j)
	})
	return s.drv, s.drvErr
}

// New returns a Service over the state root in opts.Paths.
func New(opts Options) (*Service, error) {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if opts.Paths.Home == "" {
		return nil, fmt.Errorf("sandbox: no state root: %w", errdefs.ErrInvalidArgument)
	}
	if err := CheckVMM(opts.VMM); err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	s := &Service{opts: opts, log: log, warm: warmpool.New(opts.Paths, log), bg: newBGWork()}
	if opts.ReadyVMs > 0 && !opts.NoWarmPool {
		s.ready = newReadyPool(s, opts.ReadyVMs)
	}
	return s, nil
}

// holdVM takes a place for a background VM (see Options.HoldVM).
func (s *Service) holdVM(memMiB int) (release func(), ok bool) {
	if s.opts.HoldVM == nil {
		return func() {}, true
	}
	return s.opts.HoldVM(memMiB)
}

// Close ends the Service's background work: ready VMs are discarded and
// snapshot builds under way cancelled, and it waits for both (and for
// background teardowns, as Wait). Runs must be over. Idempotent.
func (s *Service) Close() {
	s.ready.close()
	s.bg.close()
	s.Wait()
}
