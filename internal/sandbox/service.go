package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"isopod/internal/errdefs"
	"isopod/internal/jail"
	"isopod/internal/settings"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// Options configures a Service: the settings read at the front ends,
// whole, and what the front end itself decides.
type Options struct {
	settings.Settings
	Logger  *slog.Logger // nil: discard
	Driver  vmm.Driver   // nil: the one Settings.VMM names (wiring.go)
	Version string       // isopod version, recorded in stages and reports
	// Settings.ReadyVMs (ready.go) and BackgroundSnapshots are for a
	// front end that lives long; it must call Close.
	//
	// BackgroundSnapshots builds a missing warm-pool snapshot after the
	// run that needed it, which boots cold, instead of inside it.
	BackgroundSnapshots bool
	// HoldVM, when set, takes a place for a VM of memMiB of guest memory
	// that the front end's admission does not see otherwise (a ready VM,
	// a background snapshot build), at once or not at all; release gives
	// it back. Without a place the VM is not made.
	HoldVM func(memMiB int) (release func(), ok bool)
}

// UnconfinedWarning is the warning every run's report carries under JailOff.
const UnconfinedWarning = "unconfined: ISOPOD_JAIL=off runs the VMM without its jail"

// jailReport is what a run's report says about the jail.
func (s *Service) jailReport() []string {
	if s.opts.Jail == settings.JailOff {
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
		if s.opts.Jail != settings.JailOff {
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
