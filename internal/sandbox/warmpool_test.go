package sandbox

import (
	"sync/atomic"
	"testing"

	"isopod/internal/paths"
	"isopod/internal/settings"
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
