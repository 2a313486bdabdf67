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
// free.
func (s *Service) buildInBackground(drv vmm.Driver, in warmInputs) {
	key := in.key.ID()
	s.bg.Start(key, func(ctx context.Context) {
		for {
			yielded, err := s.buildHeld(ctx, drv, in)
			switch {
			case err == nil || ctx.Err() != nil:
				return
			case !yielded:
				s.log.Warn("warm pool: background snapshot build failed", "key", key, "err", err)
				return
			}
			s.log.Info("warm pool: a call took the background build's place; it is tried again when a place is free", "key", key)
		}
	})
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
