package sandbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/settings"
	"isopod/internal/warmpool"
)

// newTestService returns a Service over a fresh home with its directories
// made; it boots nothing.
func newTestService(t *testing.T) *Service {
	t.Helper()
	s, err := New(Options{Settings: settings.Settings{Paths: paths.Paths{Home: t.TempDir()}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.opts.Paths.Ensure(); err != nil {
		t.Fatal(err)
	}
	return s
}

func TestWarmRemoveArguments(t *testing.T) {
	s := newTestService(t)
	ctx := context.Background()
	for _, tt := range []struct {
		key  string
		all  bool
		want error
	}{
		{"", false, errdefs.ErrInvalidArgument},
		{"wk-1", true, errdefs.ErrInvalidArgument},
		{"../etc", false, errdefs.ErrInvalidArgument},
		{"wk-0123456789abcdef", false, errdefs.ErrNotFound},
	} {
		if _, err := s.WarmRemove(ctx, tt.key, tt.all); !errors.Is(err, tt.want) {
			t.Errorf("WarmRemove(%q, %v): %v; want %v", tt.key, tt.all, err, tt.want)
		}
	}
	k := warmpool.Key{Base: "base-min", VCPUs: 1, MemMiB: 512}
	tmp, err := s.warm.Stage(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.warm.Publish(context.Background(), tmp, &warmpool.Meta{Key: k.ID(), Parts: k}); err != nil {
		t.Fatal(err)
	}
	res, err := s.WarmRemove(ctx, k.ID()[:8], false)
	if err != nil || len(res.Removed) != 1 || res.Removed[0] != k.ID() {
		t.Errorf("rm by prefix: %+v, %v", res, err)
	}
	if res, err := s.WarmRemove(ctx, "", true); err != nil || len(res.Removed) != 0 {
		t.Errorf("rm --all of nothing: %+v, %v", res, err)
	}
}

func TestTeardownBackground(t *testing.T) {
	s := newTestService(t)
	var ran atomic.Bool
	s.teardown(func() { ran.Store(true) })
	if !ran.Load() {
		t.Fatal("a foreground teardown did not run before returning")
	}
	s.TeardownInBackground()
	release := make(chan struct{})
	var bg atomic.Bool
	s.teardown(func() { <-release; bg.Store(true) })
	if bg.Load() {
		t.Fatal("a background teardown ran in the foreground")
	}
	close(release)
	s.Wait()
	if !bg.Load() {
		t.Error("Wait returned before the background teardown finished")
	}
}
