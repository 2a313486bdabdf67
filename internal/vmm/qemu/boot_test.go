package qemu

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/errdefs"

	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

// probeCache is shared by the tests of one run so the KVM probe runs once.
var probeCache string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "isopod-qemu-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	probeCache = filepath.Join(dir, "kvmprobe.json")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// newTestDriver returns a Driver on the installed QEMU or skips.
func newTestDriver(t *testing.T) *Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		t.Skipf("%s not installed", DefaultBinary)
	}
	d, err := New(Config{ProbeCache: probeCache, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestConformance(t *testing.T) {
	vmmtest.Suite(t, vmmtest.Target{
		NewDriver: func(t *testing.T) vmm.Driver { return newTestDriver(t) },
		Guest:     vmmtest.BuildGuest,
	})
}

func TestMachineDetails(t *testing.T) {
	d := newTestDriver(t)
	g := vmmtest.BuildGuest(t)
	ctx := context.Background()

	info, err := d.Info(ctx)
	if err != nil || info.Name != "qemu" || info.Version == "" || !filepath.IsAbs(info.Path) {
		t.Fatalf("Info = %+v, %v", info, err)
	}
	t.Logf("qemu %s at %s", info.Version, info.Path)

	cfg := vmmtest.Config(t, g)
	s := vmmtest.Boot(t, d, cfg)
	m := s.M.(*Machine)

	argv, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", m.Pid()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(argv, []byte("\x00-name\x00isopod-"+cfg.ID+"\x00")) {
		t.Errorf("argv lacks -name isopod-%s: %q", cfg.ID, argv)
	}
	if pgid, err := syscall.Getpgid(m.Pid()); err != nil || pgid != m.Pid() {
		t.Errorf("pgid %d, %v; want its own group %d", pgid, err, m.Pid())
	}
	if st, err := procStartTime(m.Pid()); err != nil || st != m.StartTime() {
		t.Errorf("StartTime %d; /proc says %d, %v", m.StartTime(), st, err)
	}
	if _, ok := m.Agent().(net.Conn); !ok {
		t.Errorf("Agent is %T; want a net.Conn", m.Agent())
	}
	ret, err := m.QMP().Execute(ctx, "query-status", nil)
	if err != nil || !bytes.Contains(ret, []byte(`"running"`)) {
		t.Errorf("query-status: %s, %v", ret, err)
	}
	// Closing the agent channel does not stop the machine; the guest sees
	// the port close.
	m.Agent().Close()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(s.Serial.String(), "guestinit: port closed") {
		if time.Now().After(deadline) {
			t.Fatal("guest did not see the agent channel close")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case <-m.Done():
		t.Fatal("machine exited when its agent channel was closed")
	default:
	}
	if _, err := m.QMP().Execute(ctx, "quit", nil); err != nil && !errors.Is(err, ErrQMPClosed) {
		t.Errorf("quit: %v", err)
	}
	if err := m.Wait(); err != nil {
		t.Errorf("Wait after quit: %v", err)
	}
	if !strings.Contains(s.Serial.String(), "Linux version") {
		t.Error("console lacks the kernel banner")
	}
}

func TestStartCancelled(t *testing.T) {
	d := newTestDriver(t)
	g := vmmtest.BuildGuest(t)
	d.accel = vmm.AccelTCG
	cfg := vmmtest.Config(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if m, err := d.Start(ctx, cfg); err == nil {
		m.Kill()
		m.Wait()
		t.Fatal("Start with a cancelled context succeeded")
	} else if !errors.Is(err, context.Canceled) && !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("got %v; want a cancellation error", err)
	}
	vmmtest.AssertNoProcess(t, cfg.ID)
}

// TestKVMProbe runs the real probe where /dev/kvm opens. A garbage kernel
// must never pass; the real kernel's outcome is reported.
func TestKVMProbe(t *testing.T) {
	d := newTestDriver(t)
	g := vmmtest.BuildGuest(t)
	if err := openDevKVM(); err != nil {
		t.Skipf("/dev/kvm unusable: %v", err)
	}
	ctx := context.Background()
	garbage := filepath.Join(t.TempDir(), "vmlinuz")
	os.WriteFile(garbage, []byte("not a kernel"), 0o644)
	if err := d.probeKVM(ctx, garbage); err == nil {
		t.Error("KVM probe passed with a garbage kernel")
	}
	start := time.Now()
	err := d.probeKVM(ctx, g.Kernel)
	t.Logf("KVM probe with the test kernel: err=%v after %v", err, time.Since(start).Round(time.Millisecond))
}

// testLogger sends driver logs to the test log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(b)))
	return len(b), nil
}
