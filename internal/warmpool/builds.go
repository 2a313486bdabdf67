package warmpool

import (
	"context"
	"log/slog"
	"sync"

	"isopod/internal/vmm"
)

// Builds runs a long-lived front end's snapshot builds in the background,
// at most one per key at a time, cancelled and waited for by Close.
type Builds struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards following
	running map[string]bool
	closed  bool
}

// NewBuilds returns an empty Builds.
func NewBuilds() *Builds {
	ctx, cancel := context.WithCancel(context.Background())
	return &Builds{ctx: ctx, cancel: cancel, running: map[string]bool{}}
}

// Start runs fn in the background unless a build of key is running or
// Close was called; it reports whether it started.
func (b *Builds) Start(key string, fn func(ctx context.Context)) bool {
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

// Close cancels the builds under way and waits for them. Idempotent.
func (b *Builds) Close() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.cancel()
	b.wg.Wait()
}

// Retry starts fn under key (Start) and runs it again each time a call
// took the place it held (yielded), which ended it; it is then tried again
// once a place is free. A build that fails otherwise is logged.
func (b *Builds) Retry(key string, log *slog.Logger, fn func(ctx context.Context) (yielded bool, err error)) {
	b.Start(key, func(ctx context.Context) {
		for {
			yielded, err := fn(ctx)
			switch {
			case err == nil || ctx.Err() != nil:
				return
			case !yielded:
				log.Warn("warm pool: background snapshot build failed", "key", key, "err", err)
				return
			}
			log.Info("warm pool: a call took the background build's place; it is tried again when a place is free", "key", key)
		}
	})
}

// BuildOptions are `isopod warmpool build`'s flags: the shape of the
// runs to build for; zero means the run default.
type BuildOptions struct {
	Base string
	// Stage: build the assembled snapshot of runs on this stage (its
	// chain's root assembled; "base" for none), not the plain one.
	Stage     string
	NoNetwork bool
	VCPUs     int
	MemMiB    int
}

// BuildResult is what `isopod warmpool build` reports.
type BuildResult struct {
	OK      bool      `json:"ok"`
	Key     string    `json:"key"`
	Built   bool      `json:"built"` // false: a current snapshot was already there
	BuildMS int64     `json:"build_ms,omitempty"`
	Base    string    `json:"base"`
	VCPUs   int       `json:"vcpus"`
	MemMiB  int       `json:"mem_mib"`
	Network bool      `json:"network"`
	Accel   vmm.Accel `json:"accel"`
	Path    string    `json:"path"`
	// RootAssembled: the snapshot has the stage's root assembled (--stage).
	RootAssembled bool   `json:"root_assembled,omitempty"`
	Stage         string `json:"stage,omitempty"`
}
