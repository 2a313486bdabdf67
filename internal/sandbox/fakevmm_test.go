package sandbox_test

import (
	"context"
	"testing"
	"time"

	"isopod/internal/image"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/vmm/vmmfake"
)

// Helpers for running the core on the CPU alone: a state root that holds
// what planning a run needs, and a Service whose VMM is vmmfake, so that a
// "guest" command is a host command run by the real agent.

// newFakeService returns a Service over a fresh test root whose VMM is a
// vmmfake Driver with cfg.
func newFakeService(t *testing.T, cfg vmmfake.Config) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFake(t, cfg, false)
}

// newColdService is newFakeService without the warm pool: every run boots.
func newColdService(t *testing.T, cfg vmmfake.Config) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFake(t, cfg, true)
}

func newFake(t *testing.T, cfg vmmfake.Config, noWarm bool) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	return newFakeWith(t, cfg, func(o *sandbox.Options) { o.NoWarmPool = noWarm })
}

// newFakeWith is newFakeService with the Options adjusted by tweak. The
// Service is closed when the test ends.
func newFakeWith(t *testing.T, cfg vmmfake.Config, tweak func(*sandbox.Options)) (*sandbox.Service, *vmmfake.Driver) {
	t.Helper()
	p, kernel := sandboxtest.Root(t, image.FlavorBaseMin)
	d, err := vmmfake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	o := sandbox.Options{Settings: settings.Settings{Paths: p, Kernel: kernel}, Driver: d, Version: "test"}
	tweak(&o)
	s, err := sandbox.New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		for _, m := range d.Machines() {
			select {
			case <-m.Done():
			default:
				t.Errorf("machine %s still runs after the test", m.Config().ID)
				m.Kill()
			}
		}
	})
	return s, d
}

// run runs req with a bounded context and fails the test on an error.
func run(t *testing.T, s *sandbox.Service, req sandbox.Request) *report.Run {
	t.Helper()
	rep, err := runErr(t, s, req)
	if err != nil {
		t.Fatalf("Run %q: %v", req.Argv, err)
	}
	return rep
}

func runErr(t *testing.T, s *sandbox.Service, req sandbox.Request) (*report.Run, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if req.Cwd == "" {
		req.Cwd = "/"
	}
	return s.Run(ctx, req)
}

func code(rep *report.Run) int {
	if rep.ExitCode == nil {
		return -1
	}
	return *rep.ExitCode
}
