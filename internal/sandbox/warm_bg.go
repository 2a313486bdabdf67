package sandbox

import (
	"context"
	"sync/atomic"

	"isopod/internal/admission"
	"isopod/internal/vmm"
)

// buildInBackground builds in's snapshot after the run that needed it (a
// long-lived front end's choice: that run boots cold and reports
// snapshot_built false). The build waits for a place of its own; a call
// that needs the place ends it, and it is tried again once a place is
// free (warmpool.Builds.Retry).
func (s *Service) buildInBackground(drv vmm.Driver, in warmInputs) {
	s.bg.Retry(in.key.ID(), s.log, func(ctx context.Context) (bool, error) { return s.buildHeld(ctx, drv, in) })
}

// buildHeld builds in's snapshot in a place of its own, once one is
// free; yielded says a call took the place, which ended the build.
func (s *Service) buildHeld(ctx context.Context, drv vmm.Driver, in warmInputs) (yielded bool, _ error) {
	bctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var took atomic.Bool
	place, err := s.holdVM(ctx, in.key.MemMiB, admission.Yield{End: func() {
		took.Store(true)
		cancel()
	}}, true)
	if err != nil {
		return false, err
	}
	defer place.Release()
	_, _, err = s.buildShape(bctx, drv, in)
	return took.Load(), err
}
