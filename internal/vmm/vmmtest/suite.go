package vmmtest

import (
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

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Target is a driver under test and the guest it boots.
type Target struct {
	// NewDriver returns the driver under test.
	NewDriver func(t *testing.T) vmm.Driver
	// Guest returns what the driver boots: [BuildGuest] for a VMM that
	// runs a guest kernel, [PlaceholderGuest] for one that does not.
	Guest func(t *testing.T) Guest
	// NoKernel, when set, says why the driver runs no guest kernel. The
	// checks that need one (disks by serial, read-only disks, data kept
	// after power-off, the kernel console, a garbage kernel refused, the
	// VMM process and its end) are skipped with it as the reason.
	NoKernel string
}

// needKernel skips a check that only a real guest kernel can pass.
func (tg Target) needKernel(t *testing.T) {
	t.Helper()
	if tg.NoKernel != "" {
		t.Skip(tg.NoKernel)
	}
}

// Suite runs the conformance checks against tg.
func Suite(t *testing.T, tg Target) {
	g := tg.Guest(t)
	drv := tg.NewDriver(t)

	t.Run("BootHelloPowerOff", func(t *testing.T) { testBoot(t, tg, drv, g) })
	t.Run("CloseChannelAndKill", func(t *testing.T) { testKill(t, tg, drv, g) })
	t.Run("BadKernel", func(t *testing.T) { testBadKernel(t, tg, drv, g) })
	t.Run("InvalidConfig", func(t *testing.T) {
		cfg := Config(t, g)
		cfg.VCPUs = 0
		if m, err := drv.Start(context.Background(), cfg); err == nil {
			m.Kill()
			m.Wait()
			t.Fatal("Start with 0 vcpus succeeded")
		}
		AssertNoProcess(t, cfg.ID)
	})
	t.Run("SnapshotRestore", func(t *testing.T) { testSnapshot(t, drv, g) })
	t.Run("Prober", func(t *testing.T) { testProber(t, drv) })
}

// testBoot boots a guest with a read-only and a read-write disk, checks
// the channel, and powers it off with the host's Halt.
func testBoot(t *testing.T, tg Target, drv vmm.Driver, g Guest) {
	cfg := Config(t, g)
	ro := makeDisk(t, cfg.Dir, "ro.img", "read-only-content")
	rw := makeDisk(t, cfg.Dir, "rw.img", "")
	cfg.Disks = []vmm.Disk{
		{Path: ro, ReadOnly: true, Serial: "isopod-base"},
		{Path: rw, Serial: "isopod-scratch"},
	}
	s := Boot(t, drv, cfg)
	m := s.M
	if a := m.Accel(); a != vmm.AccelKVM && a != vmm.AccelTCG {
		t.Errorf("Accel() = %q; want kvm or tcg", a)
	}
	if s.Hello.Version == 0 || s.Hello.AgentVersion == "" {
		t.Errorf("hello %+v; want the protocol and agent versions", s.Hello)
	}
	rt := time.Now()
	s.Ping(t)
	t.Logf("agent round trip: %v", time.Since(rt).Round(time.Microsecond))

	t.Run("Disks", func(t *testing.T) {
		tg.needKernel(t)
		out, _, code := s.Exec(t, "/init", "disks")
		serials := map[string]bool{}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(line); len(f) == 2 {
				serials[f[1]] = true
			}
		}
		for _, d := range cfg.Disks {
			if code != 0 || !serials[d.Serial] {
				t.Errorf("guest does not see a disk with serial %q (exit %d, saw %v)", d.Serial, code, serials)
			}
		}
		if _, stderr, code := s.Exec(t, "/init", "write", "isopod-base", "overwritten"); code == 0 {
			t.Errorf("write to the read-only disk succeeded (stderr %q); want it refused", stderr)
		}
		if _, stderr, code := s.Exec(t, "/init", "write", "isopod-scratch", "durable-marker"); code != 0 {
			t.Errorf("write to the read-write disk: exit %d, %s", code, stderr)
		}
	})

	t.Run("ResizeDisk", func(t *testing.T) { testResize(t, tg, s, rw) })

	poff := time.Now()
	s.Halt(t)
	errs := waitAll(t, m, 2)
	t.Logf("halt to Wait returning: %v", time.Since(poff).Round(time.Millisecond))
	if errs[0] != nil || errs[1] != nil {
		t.Errorf("Wait after power-off: %v, %v; want nil for both", errs[0], errs[1])
	}
	select {
	case <-m.Done():
	default:
		t.Error("Done not closed after Wait returned")
	}

	t.Run("ProcessGone", func(t *testing.T) {
		tg.needKernel(t)
		if m.Pid() <= 0 || m.StartTime() == 0 {
			t.Errorf("Pid %d StartTime %d; want both set", m.Pid(), m.StartTime())
		}
		assertGone(t, m)
	})
	t.Run("DiskDurable", func(t *testing.T) {
		tg.needKernel(t)
		if got := readPrefix(t, rw, len("durable-marker")); got != "durable-marker" {
			t.Errorf("scratch disk after power-off starts with %q; want durable-marker", got)
		}
		if got := readPrefix(t, ro, len("read-only-content")); got != "read-only-content" {
			t.Errorf("read-only disk changed: starts with %q", got)
		}
	})
	t.Run("Console", func(t *testing.T) {
		tg.needKernel(t)
		if !strings.Contains(s.Serial.String(), "Linux version") {
			t.Errorf("console log lacks the kernel banner; got:\n%s", s.Serial.Tail(2000))
		}
	})
}

// testResize cuts the read-write disk (disk 1, 1 MiB) to half while the
// guest runs: its file is cut, and the guest writes below the new end but
// neither past it nor into a file grown again.
func testResize(t *testing.T, tg Target, s *Session, rw string) {
	r, ok := s.M.(vmm.DiskResizer)
	if !ok {
		t.Skip("the driver's machines cannot resize disks")
	}
	ctx, cancel := context.WithTimeout(context.Background(), stepTimeout)
	defer cancel()
	if err := r.ResizeDisk(ctx, 0, 1<<19); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("resizing the read-only disk: %v; want it refused as an invalid argument", err)
	}
	if err := r.ResizeDisk(ctx, 2, 1<<19); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("resizing a disk the machine lacks: %v; want it refused as an invalid argument", err)
	}
	if err := r.ResizeDisk(ctx, 1, 1<<19); err != nil {
		t.Fatal(err)
	}
	size := func() int64 {
		st, err := os.Stat(rw)
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	if got := size(); got != 1<<19 {
		t.Fatalf("disk file is %d bytes after the resize; want %d", got, 1<<19)
	}
	tg.needKernel(t)
	if _, stderr, code := s.Exec(t, "/init", "write", "isopod-scratch", "below", "4096"); code != 0 {
		t.Errorf("write below the new end: exit %d, %s", code, stderr)
	}
	if _, _, code := s.Exec(t, "/init", "write", "isopod-scratch", "past", strconv.Itoa(3<<18)); code == 0 {
		t.Error("a write past the disk's new end succeeded; want it refused")
	}
	if got := size(); got != 1<<19 {
		t.Errorf("disk file is %d bytes after the guest wrote past its end; want %d", got, 1<<19)
	}
}

// testKill checks that closing the channel leaves the machine running, and
// that Kill ends it for every waiter with one error.
func testKill(t *testing.T, tg Target, drv vmm.Driver, g Guest) {
	s := Boot(t, drv, Config(t, g))
	m := s.M
	s.Client.Close()
	select {
	case <-m.Done():
		t.Fatalf("machine exited when its agent channel was closed: %v", m.Wait())
	case <-time.After(500 * time.Millisecond):
	}
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
	t.Run("ProcessGone", func(t *testing.T) {
		tg.needKernel(t)
		assertGone(t, m)
	})
}

func testBadKernel(t *testing.T, tg Target, drv vmm.Driver, g Guest) {
	for _, tt := range []struct {
		name     string
		kernel   func(dir string) string
		real     bool // only a real guest kernel can fail it
		notFound bool
	}{
		{name: "missing", kernel: func(dir string) string { return filepath.Join(dir, "no-such-vmlinuz") }, notFound: true},
		{name: "garbage", real: true, kernel: func(dir string) string {
			p := filepath.Join(dir, "garbage-vmlinuz")
			os.WriteFile(p, bytes.Repeat([]byte("not a kernel\n"), 100), 0o644)
			return p
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.real {
				tg.needKernel(t)
			}
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
			if tt.notFound && !errors.Is(err, errdefs.ErrNotFound) {
				t.Errorf("Start with a missing kernel: %v; want ErrNotFound", err)
			}
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

// testSnapshot snapshots a booted guest and restores it: the restored
// guest sends no Hello of its own and answers the host's.
func testSnapshot(t *testing.T, drv vmm.Driver, g Guest) {
	r, ok := drv.(vmm.Restorer)
	if !ok {
		t.Skip("the driver is not a vmm.Restorer")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	id, err := r.SnapshotIdentity(ctx)
	if err != nil || id.VMM == "" || (id.Accel != vmm.AccelKVM && id.Accel != vmm.AccelTCG) {
		t.Fatalf("SnapshotIdentity = %+v, %v; want a VMM and kvm or tcg", id, err)
	}
	// The machine has a read-only and a writable disk, as a run's has: a
	// restore must take both up again (a QEMU that restores writable
	// disks inactive reopens them read-write at resume).
	disks := []vmm.Disk{
		{Path: makeDisk(t, t.TempDir(), "base.img", "base"), ReadOnly: true, Serial: "isopod-base"},
		{Path: makeDisk(t, t.TempDir(), "scratch.img", ""), Serial: "isopod-scratch"},
	}
	config := func() vmm.Config {
		cfg := Config(t, g)
		cfg.Disks = disks
		return cfg
	}
	b := Boot(t, drv, config())
	snapper, ok := b.M.(vmm.Snapshotter)
	if !ok {
		t.Fatalf("%T is not a vmm.Snapshotter, but its driver restores", b.M)
	}
	dir := t.TempDir()
	if err := snapper.Snapshot(ctx, dir); err != nil {
		t.Fatalf("Snapshot: %v; console:\n%s", err, b.Serial.Tail(2000))
	}
	b.M.Kill()
	b.M.Wait()

	s := Restore(t, r, config(), dir)
	wctx, wcancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if h, err := s.Client.WaitHello(wctx); err == nil {
		t.Errorf("the restored guest sent a Hello of its own: %+v", h)
	}
	wcancel()
	s.Ping(t)
	s.Halt(t)
	if errs := waitAll(t, s.M, 1); errs[0] != nil {
		t.Errorf("Wait after the restored guest's power-off: %v", errs[0])
	}

	testPausedRestore(t, ctx, r, config, dir)
	testSnapshotOfRestored(t, ctx, r, config, dir)

	bad := config()
	bad.MemMiB *= 2
	if m, err := r.Restore(ctx, bad, dir); !errors.Is(err, errdefs.ErrInvalidArgument) {
		if err == nil {
			m.Kill()
			m.Wait()
		}
		t.Errorf("Restore with another memory size: %v; want ErrInvalidArgument", err)
	}
	AssertNoProcess(t, bad.ID)
	none := Config(t, g)
	if m, err := r.Restore(ctx, none, t.TempDir()); !errors.Is(err, errdefs.ErrNotFound) {
		if err == nil {
			m.Kill()
			m.Wait()
		}
		t.Errorf("Restore from an empty directory: %v; want ErrNotFound", err)
	}
}

// waitAll calls m.Wait from n goroutines and returns what each got.
func waitAll(t *testing.T, m vmm.Machine, n int) []error {
	t.Helper()
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = m.Wait()
		}()
	}
	waitDone(t, &wg)
	return errs
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
