package sandbox

import (
	"context"
	"sync"

	"isopod/internal/vmm"
)

// bgWork runs a long-lived front end's background work (snapshot builds),
// at most one per key at a time, cancelled and waited for by close.
type bgWork struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards following
	running map[string]bool
	closed  bool
}

func newBGWork() *bgWork {
	ctx, cancel := context.WithCancel(context.Background())
	return &bgWork{ctx: ctx, cancel: cancel, running: map[string]bool{}}
}

// start runs fn in the background unless work of key is running or the
// work was closed; it reports whether it started.
func (b *bgWork) start(key string, fn func(ctx context.Context)) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.running[key] {
		return false
	}
	b.running[key] = true
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer func() {
			b.mu.Lock()
			delete(b.running, key)
			b.mu.Unlock()
		}()
		fn(b.ctx)
	}()
	return true
}

// close cancels the work under way and waits for it. Idempotent.
func (b *bgWork) close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// buildInBackground builds in's snapshot after the run that needed it (a
// long-lived front end's choice: that run boots cold and reports
// snapshot_built false).
func (s *Service) buildInBackground(drv vmm.Driver, in warmInputs) {
	key := in.key.ID()
	s.bg.start("snapshot "+key, func(ctx context.Context) {
		release, ok := s.holdVM(in.key.MemMiB)
		if !ok {
			s.log.Info("warm pool: no room to build a snapshot in the background; a later run tries again", "key", key)
			return
		}
		defer release()
		if _, _, err := s.buildShape(ctx, drv, in); err != nil && ctx.Err() == nil {
			s.log.Warn("warm pool: background snapshot build failed", "key", key, "err", err)
		}
	})
}
