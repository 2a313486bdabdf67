package sandbox

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/agent"
	"isopod/internal/agentclient"
	"isopod/internal/egress"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/paths"
	"isopod/internal/settings"
	"isopod/internal/vmm/vmmfake"
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
	if err := s.warm.Publish(tmp, &warmpool.Meta{Key: k.ID(), Parts: k}); err != nil {
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

// TestConfigureResumed drives the real agent protocol server (without a
// VM) with what a resumed run sends before its command.
func TestConfigureResumed(t *testing.T) {
	s := newTestService(t)
	hostEnd, guestEnd := net.Pipe()
	sys := vmmfake.NewSystem()
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agent.Serve(ctx, guestEnd, agent.Options{System: sys}) }()
	t.Cleanup(func() {
		cancel()
		hostEnd.Close()
		guestEnd.Close()
		<-served
	})
	n, err := s.startNetwork(nil, "vm-test", t.TempDir(), egress.Rules{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.Close)
	r := &run{s: s, dir: &vmDir{rec: &vmRecord{Name: "brave-otter"}}, rep: &Report{}, vm: &machine.Machine{Net: n},
		t0: time.Now(), req: Request{TimeoutS: 60},
		client: agentclient.New(hostEnd, nil)}
	t.Cleanup(func() { r.client.Close() })
	if _, err := r.client.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := r.configureResumed(ctx); err != nil {
		t.Fatal(err)
	}
	st := sys.State()
	if len(st.LastSeed) < 64 {
		t.Errorf("entropy: %d bytes; want at least 64", len(st.LastSeed))
	}
	if d := st.Clock.Sub(before); d < -time.Second || d > time.Second {
		t.Errorf("clock sent %v, %v off the host's", st.Clock, d)
	}
	if st.Hostname != "brave-otter" {
		t.Errorf("hostname %q", st.Hostname)
	}
	if st.Net == nil || st.Net.Address != n.AgentConfig().Address || r.rep.GuestIP == "" {
		t.Errorf("network: %+v, guest ip %q", st.Net, r.rep.GuestIP)
	}
	// Two resumes never get the same seed.
	if err := r.configureResumed(ctx); err != nil {
		t.Fatal(err)
	}
	if string(st.LastSeed) == string(sys.State().LastSeed) {
		t.Error("two resumes sent the same entropy")
	}
}
