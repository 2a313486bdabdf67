package sandbox

import (
	"context"
	"isopod/internal/warmpool"
	"testing"
	"time"
)

// SetInlineBuildMin sets the least time a build inside a run gets for
// the rest of the test, which must not run in parallel with others.
func SetInlineBuildMin(t testing.TB, d time.Duration) {
	old := inlineBuildMin
	inlineBuildMin = d
	t.Cleanup(func() { inlineBuildMin = old })
}

// WarmList is the warm-pool listing as the CLI makes it, for the tests.
func (s *Service) WarmList(ctx context.Context) (*warmpool.ListResult, error) {
	return s.warm.List(s.WarmStale(ctx)), nil
}

// Admit admits req as Run does and returns the request that runs, with
// what it opened, and its release.
func Admit(ctx context.Context, s *Service, req Request) (Request, func(), error) {
	req, _, _, err := s.admit(ctx, req)
	return req, func() { req.Workspace.Release() }, err
}
