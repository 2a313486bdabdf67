package sandbox

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/agent"
	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/config"
	"isopod/internal/errdefs"
)

func TestWarmEligible(t *testing.T) {
	base := &plan{}
	forked := &plan{layers: []string{"/l0"}, stage: &stageRef{ID: "st-1"}}
	tests := []struct {
		name string
		req  Request
		pl   *plan
		want bool
	}{
		{"default", Request{Stage: BaseStage}, base, true},
		{"filtered egress", Request{Stage: BaseStage, AllowHosts: []string{"example.com"}}, base, true},
		{"other sizes", Request{Stage: BaseStage, VCPUs: 2, MemMiB: 256}, base, true},
		{"no network", Request{Stage: BaseStage, NoNetwork: true}, base, false},
		{"commit", Request{Stage: BaseStage, CommitAs: "x"}, base, false},
		{"scratch size", Request{Stage: BaseStage, ScratchMiB: DefaultScratchMiB}, base, false},
		{"forked stage", Request{Stage: "deps"}, forked, false},
	}
	for _, tt := range tests {
		if got := warmEligible(tt.req, tt.pl); got != tt.want {
			t.Errorf("%s: eligible %v; want %v", tt.name, got, tt.want)
		}
	}
}

func sampleKey() WarmKey {
	return WarmKey{
		Format: warmFormat, VMM: "qemu /usr/bin/qemu:1:2", HostKernel: "6.1", CPUModel: "cpu flags:00",
		Accel: "tcg", GuestKernel: "sha256:aa", Initramfs: "bb", Base: "base-min", BaseSHA256: "cc",
		VCPUs: 1, MemMiB: 512, Protocol: 1,
	}
}

func TestWarmKeyChangesWithEveryPart(t *testing.T) {
	k := sampleKey()
	id := k.ID()
	if id != sampleKey().ID() || !strings.HasPrefix(id, warmKeyPrefix) || len(id) != len(warmKeyPrefix)+16 {
		t.Fatalf("ID %q: not stable or not wk-<16 hex>", id)
	}
	changes := map[string]func(*WarmKey){
		"format":       func(k *WarmKey) { k.Format++ },
		"vmm":          func(k *WarmKey) { k.VMM += "x" },
		"host kernel":  func(k *WarmKey) { k.HostKernel += "x" },
		"cpu model":    func(k *WarmKey) { k.CPUModel += "x" },
		"accel":        func(k *WarmKey) { k.Accel = "kvm" },
		"guest kernel": func(k *WarmKey) { k.GuestKernel += "x" },
		"initramfs":    func(k *WarmKey) { k.Initramfs += "x" },
		"base build":   func(k *WarmKey) { k.BaseSHA256 += "x" },
		"vcpus":        func(k *WarmKey) { k.VCPUs = 2 },
		"memory":       func(k *WarmKey) { k.MemMiB = 256 },
		"protocol":     func(k *WarmKey) { k.Protocol++ },
	}
	for name, change := range changes {
		o := sampleKey()
		change(&o)
		if o.ID() == id {
			t.Errorf("changing %s keeps the key", name)
		}
		if d := k.diff(o); len(d) != 1 || d[0] != name {
			t.Errorf("changing %s: diff says %v", name, d)
		}
	}
}

func TestTmpKey(t *testing.T) {
	if got := tmpKey(".tmp-wk-0123456789abcdef-deadbeef"); got != "wk-0123456789abcdef" {
		t.Errorf("tmpKey: %q", got)
	}
}

// newTestService returns a Service over a fresh home with its directories
// made; it boots nothing.
func newTestService(t *testing.T) *Service {
	t.Helper()
	s, err := New(Options{Paths: config.Paths{Home: t.TempDir()}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.opts.Paths.Ensure(); err != nil {
		t.Fatal(err)
	}
	return s
}

// fakeSnapshot writes a complete snapshot directory for k (no VM needed for
// the store's bookkeeping) under a temporary name, as a builder would.
func fakeSnapshot(t *testing.T, s *Service, k WarmKey, buildID string) string {
	t.Helper()
	tmp := filepath.Join(s.opts.Paths.Snapshots(), warmTmpPrefix+k.ID()+"-"+randomHex(4))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(tmp, "memory"), []byte("ram"), 0o600)
	if err := writeJSONFile(filepath.Join(tmp, warmMetaFile), &warmMeta{Key: k.ID(), Parts: k, BuildID: buildID, Built: time.Now()}); err != nil {
		t.Fatal(err)
	}
	return tmp
}

func listSnapshots(t *testing.T, s *Service) []string {
	t.Helper()
	ents, _ := os.ReadDir(s.opts.Paths.Snapshots())
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	return names
}

func TestWarmPublishReplaceRetire(t *testing.T) {
	s := newTestService(t)
	k := sampleKey()
	if err := s.publishWarm(fakeSnapshot(t, s, k, "one"), k.ID()); err != nil {
		t.Fatal(err)
	}
	m, err := readWarm(s.warmDir(k.ID()))
	if err != nil || m.BuildID != "one" {
		t.Fatalf("after publish: %+v, %v", m, err)
	}
	// A rebuild replaces it; nothing else is left behind.
	if err := s.publishWarm(fakeSnapshot(t, s, k, "two"), k.ID()); err != nil {
		t.Fatal(err)
	}
	if m, _ := readWarm(s.warmDir(k.ID())); m == nil || m.BuildID != "two" {
		t.Fatalf("after replace: %+v", m)
	}
	if got := listSnapshots(t, s); len(got) != 1 || got[0] != k.ID() {
		t.Errorf("after replace: %v", got)
	}
	// Retiring the build a run tried leaves a newer build alone.
	if ok, _ := s.retireWarm(k.ID(), "one"); ok {
		t.Error("retired a newer build than the one named")
	}
	if ok, _ := s.retireWarm(k.ID(), "two"); !ok {
		t.Error("did not retire the named build")
	}
	if got := listSnapshots(t, s); len(got) != 0 {
		t.Errorf("after retire: %v", got)
	}
}

func TestWarmRetireWaitsForResumers(t *testing.T) {
	s := newTestService(t)
	k := sampleKey()
	if err := s.publishWarm(fakeSnapshot(t, s, k, "one"), k.ID()); err != nil {
		t.Fatal(err)
	}
	// A run loading the snapshot holds the shared lock.
	reader := flock.New(s.warmLockPath(k.ID(), "lock"))
	if err := reader.RLock(); err != nil {
		t.Fatal(err)
	}
	var retired atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		ok, _ := s.retireWarm(k.ID(), "")
		retired.Store(ok)
	}()
	time.Sleep(100 * time.Millisecond)
	if _, err := os.Stat(s.warmDir(k.ID())); err != nil {
		t.Fatal("the snapshot was removed while a run was loading it")
	}
	reader.Unlock()
	<-done
	if !retired.Load() {
		t.Error("retire did not happen after the run finished loading")
	}
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
	k := sampleKey()
	s.publishWarm(fakeSnapshot(t, s, k, "one"), k.ID())
	res, err := s.WarmRemove(ctx, "", true)
	if err != nil || len(res.Removed) != 1 || res.Removed[0] != k.ID() {
		t.Errorf("rm --all: %+v, %v", res, err)
	}
}

func TestWarmGC(t *testing.T) {
	s := newTestService(t)
	k := sampleKey()
	// A snapshot whose base is not built here, a builder's leftover, a
	// replaced snapshot, and a live builder's temporary directory.
	s.publishWarm(fakeSnapshot(t, s, k, "one"), k.ID())
	leftover := fakeSnapshot(t, s, k, "two")
	os.Mkdir(filepath.Join(s.opts.Paths.Snapshots(), warmOldPrefix+k.ID()+"-00000000"), 0o700)
	live := sampleKey()
	live.MemMiB = 256
	liveTmp := fakeSnapshot(t, s, live, "three")
	lk := flock.New(s.warmLockPath(live.ID(), "build"))
	if err := lk.Lock(); err != nil {
		t.Fatal(err)
	}
	defer lk.Unlock()

	removed := s.gcWarm()
	sort.Strings(removed)
	if got := listSnapshots(t, s); len(got) != 1 || got[0] != filepath.Base(liveTmp) {
		t.Errorf("after gc: %v (removed %v); want only the live builder's %s", got, removed, filepath.Base(liveTmp))
	}
	if len(removed) != 3 || !strings.Contains(strings.Join(removed, " "), filepath.Base(leftover)) {
		t.Errorf("removed %v", removed)
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

// recordingSystem is the guest agent's machine side, recording what a
// resumed run asks of it.
type recordingSystem struct {
	mu       sync.Mutex
	hostname string
	clock    time.Time
	net      *agentproto.NetConfig
	seed     []byte
}

func (r *recordingSystem) SetHostname(name string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hostname = name
	return nil
}

func (r *recordingSystem) SetClock(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.clock = t
	return nil
}

func (r *recordingSystem) ConfigureNet(cfg agentproto.NetConfig) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.net = &cfg
	return nil
}

func (r *recordingSystem) AddEntropy(seed []byte) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seed = append([]byte(nil), seed...)
	return nil
}

func (r *recordingSystem) SyncDisks() error { return nil }

// TestConfigureResumed drives the real agent protocol server (without a
// VM) with what a resumed run sends before its command.
func TestConfigureResumed(t *testing.T) {
	s := newTestService(t)
	hostEnd, guestEnd := net.Pipe()
	sys := &recordingSystem{}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- agent.Serve(ctx, guestEnd, agent.Options{System: sys}) }()
	t.Cleanup(func() {
		cancel()
		hostEnd.Close()
		guestEnd.Close()
		<-served
	})
	n, err := s.startNetwork("vm-test", t.TempDir(), Request{}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(n.close)
	r := &run{s: s, rec: &vmRecord{Name: "brave-otter"}, rep: &Report{}, network: n,
		client: agentclient.New(hostEnd, nil)}
	t.Cleanup(func() { r.client.Close() })
	if _, err := r.client.Hello(ctx); err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := r.configureResumed(ctx); err != nil {
		t.Fatal(err)
	}
	sys.mu.Lock()
	defer sys.mu.Unlock()
	if len(sys.seed) < 64 {
		t.Errorf("entropy: %d bytes; want at least 64", len(sys.seed))
	}
	if d := sys.clock.Sub(before); d < -time.Second || d > time.Second {
		t.Errorf("clock sent %v, %v off the host's", sys.clock, d)
	}
	if sys.hostname != "brave-otter" {
		t.Errorf("hostname %q", sys.hostname)
	}
	if sys.net == nil || sys.net.Address != n.agentConfig().Address || r.rep.GuestIP == "" {
		t.Errorf("network: %+v, guest ip %q", sys.net, r.rep.GuestIP)
	}
	// Two resumes never get the same seed.
	first := append([]byte(nil), sys.seed...)
	sys.mu.Unlock()
	err = r.configureResumed(ctx)
	sys.mu.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if string(first) == string(sys.seed) {
		t.Error("two resumes sent the same entropy")
	}
}

// TestWarmKeyHostParts: the parts read from the host are filled in and
// follow what they name (the VMM binary's size and time).
func TestWarmKeyHostParts(t *testing.T) {
	if rel, build, _ := strings.Cut(hostKernelID(), " "); rel == "" || build == "" {
		t.Errorf("host kernel id %q lacks the release or the build", hostKernelID())
	}
	if m := cpuModelID(); !strings.Contains(m, "flags:") || strings.HasPrefix(m, " ") {
		t.Errorf("cpu model id %q", m)
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "qemu-system-x86_64")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(config.EnvQEMU, bin)
	s := newTestService(t)
	before, err := s.vmmIdentity(context.Background())
	if err != nil || !strings.Contains(before, bin) {
		t.Fatalf("vmm identity %q (%v); want it to name %s", before, err, bin)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n# rebuilt\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if after, _ := s.vmmIdentity(context.Background()); after == before {
		t.Errorf("vmm identity %q did not change with the binary", after)
	}
	t.Setenv(config.EnvAccel, "tcg")
	if a := s.expectedAccel(); a != "tcg" {
		t.Errorf("expected accel %q under %s=tcg", a, config.EnvAccel)
	}
}
