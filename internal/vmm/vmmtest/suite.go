package vmmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/vmm"
)

// Bounds for a guest under TCG on a loaded host.
const (
	bootTimeout = 120 * time.Second
	stepTimeout = 30 * time.Second
)

// Suite runs the conformance checks against the Driver newDriver returns.
func Suite(t *testing.T, newDriver func(t *testing.T) vmm.Driver) {
	g := BuildGuest(t)
	drv := newDriver(t)

	t.Run("BootChannelDisksPowerOff", func(t *testing.T) { testBoot(t, drv, g) })
	t.Run("Kill", func(t *testing.T) { testKill(t, drv, g) })
	t.Run("BadKernel", func(t *testing.T) { testBadKernel(t, drv, g) })
	t.Run("InvalidConfig", func(t *testing.T) {
		cfg := Config(t, g)
		cfg.VCPUs = 0
		if m, err := drv.Start(context.Background(), cfg); err == nil {
			m.Kill()
			t.Fatal("Start with 0 vcpus succeeded")
		}
		AssertNoProcess(t, cfg.ID)
	})
}

// Config is a small guest config with a fresh ID and directory.
func Config(t *testing.T, g Guest) vmm.Config {
	t.Helper()
	return vmm.Config{
		ID:      "t" + strconv.FormatInt(time.Now().UnixNano()%1e12, 36),
		Dir:     t.TempDir(),
		Kernel:  g.Kernel,
		Initrd:  g.Initrd,
		Cmdline: "panic=-1",
		VCPUs:   1,
		MemMiB:  256,
	}
}

// Session is a booted test guest and its line channel.
type Session struct {
	M      vmm.Machine
	Cfg    vmm.Config
	Serial *SyncBuffer
	// Boot is the time from Start to the guest's first line.
	Boot time.Duration

	lines chan string
	rerr  error
}

// Boot starts cfg (with a console buffer) and waits for the guest's HELLO.
// The machine is killed and waited for in t.Cleanup.
func Boot(t *testing.T, drv vmm.Driver, cfg vmm.Config) *Session {
	t.Helper()
	s := &Session{Cfg: cfg, Serial: &SyncBuffer{}, lines: make(chan string, 64)}
	s.Cfg.SerialLog = s.Serial
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	start := time.Now()
	m, err := drv.Start(ctx, s.Cfg)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	s.M = m
	t.Cleanup(func() {
		m.Kill()
		m.Wait()
		m.Agent().Close()
	})
	if tm, ok := m.(vmm.Timing); ok {
		start = tm.Started()
	}
	go func() {
		br := bufio.NewReader(m.Agent())
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				s.rerr = err
				close(s.lines)
				return
			}
			s.lines <- strings.TrimSuffix(line, "\n")
		}
	}()
	hello := s.recv(t, bootTimeout)
	s.Boot = time.Since(start)
	if hello != "HELLO isopod" {
		t.Fatalf("first agent line %q; want HELLO isopod", hello)
	}
	t.Logf("boot to first agent line: %v (accel %s)", s.Boot.Round(time.Millisecond), m.Accel())
	return s
}

// Send writes one line to the guest.
func (s *Session) Send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(s.M.Agent(), line+"\n"); err != nil {
		t.Fatalf("send %q: %v", line, err)
	}
}

// Recv reads one line from the guest.
func (s *Session) Recv(t *testing.T) string {
	t.Helper()
	return s.recv(t, stepTimeout)
}

func (s *Session) recv(t *testing.T, limit time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-s.lines:
		if !ok {
			t.Fatalf("agent channel ended: %v; console:\n%s", s.rerr, s.Serial.Tail(3000))
		}
		return line
	case <-time.After(limit):
		t.Fatalf("no agent line within %v; console:\n%s", limit, s.Serial.Tail(3000))
	}
	return ""
}

func testBoot(t *testing.T, drv vmm.Driver, g Guest) {
	cfg := Config(t, g)
	ro := makeDisk(t, cfg.Dir, "ro.img", "read-only-content")
	rw := makeDisk(t, cfg.Dir, "rw.img", "")
	cfg.Disks = []vmm.Disk{
		{Path: ro, ReadOnly: true, Serial: "isopod-base"},
		{Path: rw, Serial: "isopod-scratch"},
	}
	s := Boot(t, drv, cfg)
	m := s.M
	if m.Pid() <= 0 || m.StartTime() == 0 {
		t.Errorf("Pid %d StartTime %d; want both set", m.Pid(), m.StartTime())
	}
	if a := m.Accel(); a != vmm.AccelKVM && a != vmm.AccelTCG {
		t.Errorf("Accel() = %q; want kvm or tcg", a)
	}

	rt := time.Now()
	s.Send(t, "ECHO round trip ü")
	if got := s.Recv(t); got != "ECHO round trip ü" {
		t.Errorf("echo: got %q", got)
	}
	t.Logf("agent round trip: %v", time.Since(rt).Round(time.Microsecond))

	s.Send(t, "DISKS")
	serials := map[string]bool{}
	for line := s.Recv(t); line != "END"; line = s.Recv(t) {
		f := strings.Fields(line)
		if len(f) == 3 && f[0] == "DISK" {
			serials[f[2]] = true
		}
	}
	for _, d := range cfg.Disks {
		if !serials[d.Serial] {
			t.Errorf("guest does not see a disk with serial %q (saw %v)", d.Serial, serials)
		}
	}

	s.Send(t, "WRITE isopod-base overwritten")
	if got := s.Recv(t); !strings.HasPrefix(got, "ERR") {
		t.Errorf("write to read-only disk: got %q; want an error", got)
	}
	s.Send(t, "WRITE isopod-scratch durable-marker")
	if got := s.Recv(t); got != "OK" {
		t.Errorf("write to read-write disk: got %q; want OK", got)
	}
	poff := time.Now()
	s.Send(t, "POWEROFF")

	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Wait()
		}()
	}
	waitDone(t, &wg)
	t.Logf("power-off to Wait returning: %v", time.Since(poff).Round(time.Millisecond))
	if errs[0] != nil || errs[1] != nil {
		t.Errorf("Wait after power-off: %v, %v; want nil for both", errs[0], errs[1])
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed after Wait returned")
	}
	assertGone(t, m)

	if got := readPrefix(t, rw, len("durable-marker")); got != "durable-marker" {
		t.Errorf("scratch disk after power-off starts with %q; want durable-marker", got)
	}
	if got := readPrefix(t, ro, len("read-only-content")); got != "read-only-content" {
		t.Errorf("read-only disk changed: starts with %q", got)
	}
	if !strings.Contains(s.Serial.String(), "Linux version") {
		t.Errorf("console log lacks the kernel banner; got:\n%s", s.Serial.Tail(2000))
	}
}

func testKill(t *testing.T, drv vmm.Driver, g Guest) {
	s := Boot(t, drv, Config(t, g))
	m := s.M
	errs := make([]error, 2)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(2)
		go func() {
			defer wg.Done()
			if err := m.Kill(); err != nil {
				t.Errorf("Kill: %v", err)
			}
		}()
		go func() {
			defer wg.Done()
			errs[i] = m.Wait()
		}()
	}
	waitDone(t, &wg)
	if errs[0] == nil || errs[0] != errs[1] {
		t.Errorf("Wait after Kill: %v and %v; want one non-nil error for both", errs[0], errs[1])
	}
	if err := m.Kill(); err != nil {
		t.Errorf("Kill after exit: %v", err)
	}
	assertGone(t, m)
}

func testBadKernel(t *testing.T, drv vmm.Driver, g Guest) {
	for _, tt := range []struct {
		name   string
		kernel func(dir string) string
	}{
		{"missing", func(dir string) string { return filepath.Join(dir, "no-such-vmlinuz") }},
		{"garbage", func(dir string) string {
			p := filepath.Join(dir, "garbage-vmlinuz")
			os.WriteFile(p, bytes.Repeat([]byte("not a kernel\n"), 100), 0o644)
			return p
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg := Config(t, g)
			cfg.Kernel = tt.kernel(cfg.Dir)
			ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
			defer cancel()
			m, err := drv.Start(ctx, cfg)
			if err == nil {
				m.Kill()
				m.Wait()
				t.Fatal("Start with a bad kernel succeeded")
			}
			t.Logf("error: %v", err)
			AssertNoProcess(t, cfg.ID)
			left, _ := os.ReadDir(cfg.Dir)
			for _, e := range left {
				if e.Type()&os.ModeSocket != 0 {
					t.Errorf("socket %s left in the vm dir", e.Name())
				}
			}
		})
	}
}

// AssertNoProcess fails if a process whose argv mentions isopod-<id> exists.
func AssertNoProcess(t *testing.T, id string) {
	t.Helper()
	ents, _ := os.ReadDir("/proc")
	want := []byte("isopod-" + id + "\x00")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		argv, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err == nil && bytes.Contains(argv, want) {
			t.Errorf("process %s still runs for vm %s", e.Name(), id)
		}
	}
}

// assertGone checks that the machine's pid no longer names its process.
func assertGone(t *testing.T, m vmm.Machine) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(m.Pid()) + "/stat")
	if errors.Is(err, os.ErrNotExist) {
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if i := bytes.LastIndexByte(b, ')'); i > 0 {
		f := bytes.Fields(b[i+1:])
		if len(f) > 19 && string(f[19]) != strconv.FormatUint(m.StartTime(), 10) {
			return // the pid was reused by another process
		}
	}
	t.Errorf("process %d still exists after Wait", m.Pid())
}

func waitDone(t *testing.T, wg *sync.WaitGroup) {
	t.Helper()
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	select {
	case <-ch:
	case <-time.After(stepTimeout):
		t.Fatal("Wait did not return")
	}
}

func makeDisk(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(content); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(1 << 20); err != nil {
		t.Fatal(err)
	}
	return p
}

func readPrefix(t *testing.T, path string, n int) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(f, b); err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// SyncBuffer is a bytes.Buffer safe for one writer and concurrent readers.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Tail returns the last n bytes written.
func (b *SyncBuffer) Tail(n int) string {
	s := b.String()
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
