package sandbox

import (
	"context"
	"fmt"
	"log/slog"

	"isopod/internal/config"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Options configures a Service.
type Options struct {
	Paths   config.Paths
	Logger  *slog.Logger // nil: discard
	Driver  vmm.Driver   // nil: QEMU
	Version string       // isopod version, recorded in stages and reports
	// AllowBaseSkew lets forks boot over a rebuilt base (ISOPOD_ALLOW_BASE_SKEW=1).
	// Front ends read it from their own environment only.
	AllowBaseSkew bool
}

// Service is the core both front ends call. It is safe for concurrent use.
type Service struct {
	opts Options
	log  *slog.Logger
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
	return &Service{opts: opts, log: log}, nil
}

// Run boots a fresh microVM, runs req.Argv in it, optionally copies files out
// and commits the scratch layer, destroys the VM and reports. A guest's
// non-zero exit is a normal report; an error means isopod itself failed.
// Cancelling ctx tears the VM down.
func (s *Service) Run(ctx context.Context, req Request) (*Report, error) {
	return nil, fmt.Errorf("run: %w", errdefs.ErrNotSupported)
}

// StageList lists stages oldest first.
func (s *Service) StageList(ctx context.Context) (*StageListResult, error) {
	return nil, errdefs.ErrNotSupported
}

// StageInfo resolves ref and describes the stage and its chain.
func (s *Service) StageInfo(ctx context.Context, ref string) (*StageInfoResult, error) {
	return nil, errdefs.ErrNotSupported
}

// StageRemove removes a stage no other stage builds on.
func (s *Service) StageRemove(ctx context.Context, ref string) (*StageRemoveResult, error) {
	return nil, errdefs.ErrNotSupported
}

// VMList lists VM records newest first.
func (s *Service) VMList(ctx context.Context) (*VMListResult, error) {
	return nil, errdefs.ErrNotSupported
}

// VMGC kills orphaned VMM processes and prunes all but the newest keepLast
// records (never a live one).
func (s *Service) VMGC(ctx context.Context, keepLast int) (*VMGCResult, error) {
	return nil, errdefs.ErrNotSupported
}

// ImageList lists the bases a run accepts.
func (s *Service) ImageList(ctx context.Context) (*ImageListResult, error) {
	return nil, errdefs.ErrNotSupported
}
