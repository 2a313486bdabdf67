package vmmfake_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/vmm/vmmtest"
)

func newDriver(t testing.TB, cfg vmmfake.Config) *vmmfake.Driver {
	t.Helper()
	d, err := vmmfake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	vmmtest.Suite(t, vmmtest.Target{
		NewDriver: func(t *testing.T) vmm.Driver { return newDriver(t, vmmfake.Config{}) },
		Guest:     vmmtest.PlaceholderGuest,
		NoKernel:  "vmmfake runs the guest agent inside the test process: no guest kernel, disks or VMM process",
	})
}

func TestConfigValidate(t *testing.T) {
	for _, tt := range []struct {
		name string
		cfg  vmmfake.Config
		ok   bool
	}{
		{"zero", vmmfake.Config{}, true},
		{"kvm", vmmfake.Config{Accel: vmm.AccelKVM}, true},
		{"unknown accel", vmmfake.Config{Accel: "hvf"}, false},
		{"negative delay", vmmfake.Config{BootDelay: -time.Second}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := vmmfake.New(tt.cfg)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, errdefs.ErrInvalidArgument)) {
				t.Errorf("New: %v; want ok=%v or ErrInvalidArgument", err, tt.ok)
			}
		})
	}
}

// boot starts a fake machine and waits for its Hello.
func boot(t *testing.T, d *vmmfake.Driver, mutate func(*vmm.Config)) *vmmtest.Session {
	t.Helper()
	cfg := vmmtest.Config(t, vmmtest.PlaceholderGuest(t))
	if mutate != nil {
		mutate(&cfg)
	}
	return vmmtest.Boot(t, d, cfg)
}

func TestMachineHasNoProcess(t *testing.T) {
	s := boot(t, newDriver(t, vmmfake.Config{}), nil)
	if s.M.Pid() != 0 || s.M.StartTime() != 0 {
		t.Errorf("Pid %d StartTime %d; want 0 and 0", s.M.Pid(), s.M.StartTime())
	}
	if !strings.Contains(s.Serial.String(), "vmmfake guest up") {
		t.Errorf("console lacks the guest's lines:\n%s", s.Serial.String())
	}
}

// pidOf waits for a file holding a pid.
func pidOf(t *testing.T, path string) int {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if b, err := os.ReadFile(path); err == nil && bytes.HasSuffix(b, []byte("\n")) {
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no pid in %s", path)
	return 0
}

// exists reports whether pid is a live process (not a zombie).
func exists(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i < 0 || i+2 >= len(b) || b[i+2] != 'Z'
}

// startSleeper starts an exec that writes its pid to a file and sleeps,
// and returns the pid and a channel with the exec's error.
func startSleeper(t *testing.T, s *vmmtest.Session) (int, chan error) {
	t.Helper()
	pidFile := filepath.Join(t.TempDir(), "pid")
	res := make(chan error, 1)
	go func() {
		_, err := s.Client.Exec(context.Background(), agentclient.ExecRequest{Exec: agentproto.Exec{
			Argv: []string{"sh", "-c", "echo $$ > " + pidFile + "; exec sleep 30"}, Cwd: "/",
		}})
		res <- err
	}()
	return pidOf(t, pidFile), res
}

func TestKillEndsGuestProcesses(t *testing.T) {
	s := boot(t, newDriver(t, vmmfake.Config{}), nil)
	pid, res := startSleeper(t, s)
	start := time.Now()
	s.M.Kill()
	if err := s.M.Wait(); !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("Wait after Kill: %v; want ErrKilled", err)
	}
	if exists(pid) {
		t.Errorf("the guest's process %d outlived Wait", pid)
	}
	if err := <-res; !errors.Is(err, agentclient.ErrClosed) {
		t.Errorf("exec running at Kill: %v; want ErrClosed", err)
	}
	t.Logf("kill to Wait: %v", time.Since(start).Round(time.Millisecond))
}

func TestCrashMidExec(t *testing.T) {
	died := errors.New("guest kernel panic")
	d := newDriver(t, vmmfake.Config{OnRequest: func(m *vmmfake.Machine, msg *agentproto.Msg) {
		if msg.Kind == agentproto.KindExec && len(msg.Exec.Argv) > 0 && msg.Exec.Argv[0] == "crash-now" {
			m.Crash(died)
		}
	}})
	s := boot(t, d, nil)
	pid, res := startSleeper(t, s)
	go s.M.(*vmmfake.Machine).Crash(died)
	if err := s.M.Wait(); !errors.Is(err, died) {
		t.Errorf("Wait after Crash: %v; want the crash's error", err)
	}
	if !strings.HasSuffix(s.Serial.String(), died.Error()+"\n") {
		t.Errorf("console does not end with the crash:\n%s", s.Serial.Tail(500))
	}
	if err := <-res; !errors.Is(err, agentclient.ErrClosed) {
		t.Errorf("exec when the guest died: %v; want ErrClosed", err)
	}
	if exists(pid) {
		t.Errorf("the guest's process %d outlived the crash", pid)
	}

	// A crash from OnRequest: the request never reaches the agent.
	s2 := boot(t, d, nil)
	_, err := s2.Client.Exec(context.Background(), agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"crash-now"}}})
	if !errors.Is(err, agentclient.ErrClosed) {
		t.Errorf("exec that crashed the guest: %v; want ErrClosed", err)
	}
	if err := s2.M.Wait(); !errors.Is(err, died) {
		t.Errorf("Wait: %v; want the crash's error", err)
	}
	if n := len(d.Machines()); n != 2 {
		t.Errorf("Machines() has %d; want 2", n)
	}
}

func TestBootDelay(t *testing.T) {
	const delay = 300 * time.Millisecond
	s := boot(t, newDriver(t, vmmfake.Config{BootDelay: delay}), nil)
	if s.Boot < delay {
		t.Errorf("hello after %v; want at least the boot delay %v", s.Boot, delay)
	}

	// Killed while it boots: no hello ever, Wait at once.
	d := newDriver(t, vmmfake.Config{BootDelay: time.Hour})
	cfg := vmmtest.Config(t, vmmtest.PlaceholderGuest(t))
	m, err := d.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(m.Agent(), nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.WaitHello(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("WaitHello during the boot delay: %v; want a timeout", err)
	}
	m.Kill()
	if err := m.Wait(); !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("Wait: %v; want ErrKilled", err)
	}
	if _, err := c.WaitHello(context.Background()); err == nil {
		t.Error("WaitHello after Kill succeeded")
	}
}

// A guest Hang picks never says hello and runs until killed; the others
// boot.
func TestHang(t *testing.T) {
	d := newDriver(t, vmmfake.Config{Hang: func(c vmm.Config) bool { return strings.Contains(c.Cmdline, "hang") }})
	boot(t, d, nil)
	cfg := vmmtest.Config(t, vmmtest.PlaceholderGuest(t))
	cfg.Cmdline += " hang"
	m, err := d.Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := agentclient.New(m.Agent(), nil)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.WaitHello(ctx); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("WaitHello from a hung guest: %v; want a timeout", err)
	}
	select {
	case <-m.Done():
		t.Fatal("a hung guest stopped on its own")
	default:
	}
	m.Kill()
	if err := m.Wait(); !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("Wait: %v; want ErrKilled", err)
	}
}

func TestStateSnapshotRestore(t *testing.T) {
	d := newDriver(t, vmmfake.Config{BootError: "no base disk"})
	s := boot(t, d, func(c *vmm.Config) { c.Cmdline += " " + agentproto.CmdlineHostname + "=first" })
	if s.Hello.BootError != "no base disk" {
		t.Errorf("hello %+v; want the boot error", s.Hello)
	}
	m := s.M.(*vmmfake.Machine)
	if got := m.State().Hostname; got != "first" {
		t.Errorf("hostname at boot %q; want the command line's", got)
	}
	ctx := context.Background()
	clock := time.Unix(1700000000, 5)
	nc := &agentproto.NetConfig{Address: "10.0.2.2/30", Gateway: "10.0.2.1", DNS: []string{"10.0.2.1"}}
	for _, call := range []struct {
		msg     *agentproto.Msg
		payload []byte
	}{
		{&agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: "second"}, nil},
		{&agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: clock.UnixNano()}}, nil},
		{&agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: nc}, nil},
		{&agentproto.Msg{Kind: agentproto.KindAddEntropy}, make([]byte, 48)},
	} {
		if err := s.Client.Call(ctx, call.msg, call.payload); err != nil {
			t.Fatalf("%s: %v", call.msg.Kind, err)
		}
	}
	st := m.State()
	if st.Hostname != "second" || !st.Clock.Equal(clock) || st.Net == nil || st.Net.Address != nc.Address ||
		st.EntropyBytes != 48 || st.EntropyCalls != 1 {
		t.Errorf("state %+v; want what the host sent", st)
	}

	dir := t.TempDir()
	if err := m.Snapshot(ctx, dir); err != nil {
		t.Fatal(err)
	}
	// Paused: requests are no longer answered.
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := s.Client.Call(pctx, &agentproto.Msg{Kind: agentproto.KindPing}, nil); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("ping to a paused guest: %v; want no answer", err)
	}
	if err := m.Snapshot(ctx, dir); err == nil {
		t.Error("a second snapshot into the same directory succeeded")
	}
	m.Kill()

	r := vmmtest.Restore(t, d, vmmtest.Config(t, vmmtest.PlaceholderGuest(t)), dir)
	rm := r.M.(*vmmfake.Machine)
	if !rm.Restored() || r.Hello.BootError != "no base disk" {
		t.Errorf("restored %v, hello %+v; want restored with the snapshot's boot error", rm.Restored(), r.Hello)
	}
	if got := rm.State(); got.Hostname != "second" || got.Net == nil || got.Syncs != 0 {
		t.Errorf("restored state %+v; want the snapshot's", got)
	}
	if err := rm.Snapshot(ctx, t.TempDir()); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("snapshot of a restored machine: %v; want ErrNotSupported", err)
	}
	r.Halt(t)
	if err := r.M.Wait(); err != nil {
		t.Errorf("Wait after halt: %v", err)
	}
	if got := rm.State().Syncs; got != 1 {
		t.Errorf("syncs %d after a halt with sync; want 1", got)
	}
}

func TestInjectedFailures(t *testing.T) {
	errStart, errSnap, errRestore := errors.New("no vcpu"), errors.New("disk full"), errors.New("bad state")
	d := newDriver(t, vmmfake.Config{
		FailStart:    func(cfg vmm.Config) error { return errIf(cfg.MemMiB == 128, errStart) },
		FailSnapshot: func(m *vmmfake.Machine, dir string) error { return errIf(m.Config().MemMiB == 512, errSnap) },
		FailRestore:  func(cfg vmm.Config, dir string) error { return errIf(cfg.VCPUs == 2, errRestore) },
	})
	ctx := context.Background()
	g := vmmtest.PlaceholderGuest(t)

	cfg := vmmtest.Config(t, g)
	cfg.MemMiB = 128
	if _, err := d.Start(ctx, cfg); !errors.Is(err, errStart) {
		t.Errorf("Start: %v; want the injected error", err)
	}
	big := boot(t, d, func(c *vmm.Config) { c.MemMiB = 512 })
	if err := big.M.(vmm.Snapshotter).Snapshot(ctx, t.TempDir()); !errors.Is(err, errSnap) {
		t.Errorf("Snapshot: %v; want the injected error", err)
	}
	big.Ping(t) // a failed snapshot leaves the guest running

	s := boot(t, d, func(c *vmm.Config) { c.VCPUs = 2 })
	dir := t.TempDir()
	if err := s.M.(vmm.Snapshotter).Snapshot(ctx, dir); err != nil {
		t.Fatal(err)
	}
	rc := vmmtest.Config(t, g)
	rc.VCPUs = 2
	if _, err := d.Restore(ctx, rc, dir); !errors.Is(err, errRestore) {
		t.Errorf("Restore: %v; want the injected error", err)
	}
	rc.VCPUs = 1
	if _, err := d.Restore(ctx, rc, dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("Restore with other sizes: %v; want ErrInvalidArgument", err)
	}
}

func errIf(cond bool, err error) error {
	if cond {
		return err
	}
	return nil
}
