package sandbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/jail"
	"isopod/internal/machine"
	"isopod/internal/settings"
	"isopod/internal/stages"
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
	// Settings.ReadyVMs (machine.Pool, ready_vm.go) and
	// BackgroundSnapshots are for a front end that lives long; it must
	// call Close.
	//
	// BackgroundSnapshots builds a missing warm-pool snapshot after the
	// run that needed it, which boots cold, instead of inside it.
	BackgroundSnapshots bool
	// CredentialStore, when set, is the credential store runs resolve
	// their aliases from instead of the state root's (a benchmark's own
	// temporary store); empty: CredentialStore(Paths.Home).
	CredentialStore string
	// Places, when set, is the front end's admission for the VMs it does
	// not see otherwise: a ready VM or a background snapshot build takes a
	// place from it before its VM starts, waiting for one to be free, and
	// gives it to a call that needs it (Yield). Nil: they need none.
	Places Places
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
	// store is the stage store, as the planner reads and commits to it.
	store *stages.Service
	// ready holds ready VMs (nil: none); bg runs background snapshot
	// builds.
	ready *machine.Pool
	bg    *warmpool.Builds
	// buildsWaiting counts background snapshot builds waiting for a place.
	buildsWaiting atomic.Int32

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
	s := &Service{opts: opts, log: log, warm: warmpool.New(opts.Paths, log), bg: warmpool.NewBuilds(),
		store: stages.New(stages.Options{Settings: opts.Settings, Logger: log, Version: opts.Version})}
	if opts.ReadyVMs > 0 && !opts.NoWarmPool {
		s.ready = machine.NewPool(log, opts.ReadyVMs, func(ctx context.Context, memMiB int, y admission.Yield) (*admission.Ticket, error) {
			return s.holdVM(ctx, memMiB, y, false)
		})
	}
	return s, nil
}

// holdVM takes a place for a background VM of memMiB from Options.Places,
// waiting for a release while there is none, until ctx ends. The place is
// nil (it holds nothing) without Places. Snapshot builds (build true) come
// before ready VMs: while one waits no ready VM takes a place, and it ends
// an idle ready VM to take its place.
func (s *Service) holdVM(ctx context.Context, memMiB int, y admission.Yield, build bool) (*admission.Ticket, error) {
	pl := s.opts.Places
	if pl == nil {
		return nil, nil
	}
	if !pl.CanHold(memMiB) {
		return nil, fmt.Errorf("a background VM of %d MiB never fits this host's memory budget beside a run: %w", memMiB, errdefs.ErrUnavailable)
	}
	if build {
		s.buildsWaiting.Add(1)
		defer s.buildsWaiting.Add(-1)
	}
	for {
		freed := pl.Freed()
		if build || s.buildsWaiting.Load() == 0 {
			if t, ok := pl.TryHold(memMiB, y); ok {
				return t, nil
			}
			if build {
				s.ready.GiveWay()
			}
		}
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Close ends the Service's background work: ready VMs are discarded and
// snapshot builds under way cancelled, and it waits for both (and for
// background teardowns, as Wait). Runs must be over. Idempotent.
func (s *Service) Close() {
	s.ready.Close()
	s.bg.Close()
	s.Wait()
}
