package sandbox_test

import (
	"context"
	"errors"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// A run's WaitPlace is asked once its request is checked and before its
// VM starts: a refused request never waits for a place, and a place that
// does not come fails the run with no VM started.
func TestRunWaitPlace(t *testing.T) {
	s, d := newColdService(t, vmmfake.Config{})
	calls := 0
	busy := errors.New("no place")
	wait := func(context.Context) error { calls++; return busy }

	_, err := s.Run(context.Background(), sandbox.Request{Argv: []string{"true"}, MemMiB: 999999, WaitPlace: wait})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || calls != 0 {
		t.Errorf("a refused request: %v after %d waits; want invalid_argument before any", err, calls)
	}
	_, err = s.Run(context.Background(), sandbox.Request{Argv: []string{"true"}, NoNetwork: true, WaitPlace: wait})
	if !errors.Is(err, busy) || calls != 1 {
		t.Errorf("a run without a place: %v after %d waits; want the wait's error", err, calls)
	}
	if n := len(d.Machines()); n != 0 {
		t.Errorf("%d VMs started without a place", n)
	}
	calls = 0
	wait = func(context.Context) error { calls++; return nil }
	rep, err := s.Run(context.Background(), sandbox.Request{Argv: []string{"true"}, NoNetwork: true, WaitPlace: wait})
	if err != nil || rep == nil || calls != 1 {
		t.Errorf("a run with a place: %v after %d waits", err, calls)
	}
}
