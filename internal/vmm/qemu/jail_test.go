package qemu

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/jail"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmtest"
)

// newJailedDriver returns a Driver that confines every QEMU, or skips when
// this host has no jail.
func newJailedDriver(t *testing.T) *Driver {
	t.Helper()
	if testing.Short() {
		t.Skip("boots a VM; skipped under -short")
	}
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		t.Skipf("%s not installed", DefaultBinary)
	}
	j, err := jail.New(jail.Config{})
	if err != nil {
		t.Skipf("no jail on this host: %v", err)
	}
	d, err := New(Config{ProbeCache: probeCache, Logger: testLogger(t), Jail: j})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestConformanceJailed: the whole suite passes with every QEMU confined.
func TestConformanceJailed(t *testing.T) {
	vmmtest.Suite(t, vmmtest.Target{
		NewDriver: func(t *testing.T) vmm.Driver { return newJailedDriver(t) },
		Guest:     vmmtest.BuildGuest,
	})
}

// TestJailedMachine: a jailed QEMU runs with QEMU's seccomp filter, no
// capabilities and another uid, and an action its filter forbids (a
// migration that would spawn a program) is refused or ends the VMM, which
// the machine's Wait reports.
func TestJailedMachine(t *testing.T) {
	d := newJailedDriver(t)
	g := vmmtest.BuildGuest(t)
	cfg := vmmtest.Config(t, g)
	s := vmmtest.Boot(t, d, cfg)
	m := s.M.(*Machine)
	status, err := os.ReadFile("/proc/" + strconv.Itoa(m.Pid()) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Seccomp:\t2", "NoNewPrivs:\t1", "CapEff:\t0000000000000000"} {
		if !strings.Contains(string(status), want) {
			t.Errorf("/proc/%d/status lacks %q", m.Pid(), want)
		}
	}
	if strings.Contains(string(status), "Uid:\t"+strconv.Itoa(os.Getuid())+"\t") && os.Getuid() == 0 {
		t.Errorf("a jailed QEMU runs as root")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, qerr := m.QMP().Execute(ctx, "migrate", map[string]any{"uri": "exec:cat > /dev/null"})
	select {
	case <-m.Done():
		t.Logf("the forbidden spawn ended QEMU: %v", m.Wait())
	case <-time.After(10 * time.Second):
		if qerr == nil {
			if st, err := m.QMP().Execute(ctx, "query-migrate", nil); err == nil && !strings.Contains(string(st), "failed") {
				t.Fatalf("a migration to exec: was neither refused nor fatal: %s", st)
			}
		}
		t.Logf("the forbidden spawn was refused: %v", qerr)
	}
	if qerr != nil && !errors.Is(qerr, ErrQMPClosed) {
		t.Logf("qmp: %v", qerr)
	}
}

// TestAccelReasonHere: on this host, the reason a jailed machine gets its
// accelerator is whole sentences, and where the CPU offers no hardware
// virtualization it says so rather than blaming a group.
func TestAccelReasonHere(t *testing.T) {
	d := newJailedDriver(t)
	g := vmmtest.BuildGuest(t)
	cfg := vmmtest.Config(t, g)
	c, err := d.chooseAccel(context.Background(), &cfg, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: %s", c.Accel, c.Reason)
	if c.Reason == "" || c.Reason[0] < 'A' || c.Reason[0] > 'Z' || !strings.HasSuffix(c.Reason, ".") {
		t.Errorf("reason %q is not a whole sentence", c.Reason)
	}
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(cpuinfo), " vmx") || strings.Contains(string(cpuinfo), " svm") {
		return
	}
	if c.Accel != vmm.AccelTCG || !strings.Contains(c.Reason, "neither vmx nor svm") || strings.Contains(c.Reason, "the kvm group)") {
		t.Errorf("on a CPU without virtualization: %s, %q", c.Accel, c.Reason)
	}
}

// TestJailedRestartSameID: once Wait has returned for a killed VMM (here a
// stopped one, as a hung snapshot VM is), a VM of the same id starts at
// once: the jail's cgroup of the first is gone by then.
func TestJailedRestartSameID(t *testing.T) {
	d := newJailedDriver(t)
	g := vmmtest.BuildGuest(t)
	cfg := vmmtest.Config(t, g)
	first := vmmtest.Boot(t, d, cfg)
	m := first.M.(*Machine)
	if len(cgroupDirs(t, d.jail.CgroupName(cfg.ID))) == 0 {
		t.Fatalf("no cgroup %s for the jailed VMM", d.jail.CgroupName(cfg.ID))
	}
	syscall.Kill(m.Pid(), syscall.SIGSTOP)
	m.Kill()
	m.Wait()
	if left := cgroupDirs(t, d.jail.CgroupName(cfg.ID)); len(left) > 0 {
		t.Errorf("after Wait, the killed VMM's cgroup is still there: %v", left)
	}
	for i := 0; i < 3; i++ {
		again := cfg
		again.Dir = t.TempDir()
		s := vmmtest.Boot(t, d, again)
		s.M.Kill()
		s.M.Wait()
		if left := cgroupDirs(t, d.jail.CgroupName(cfg.ID)); len(left) > 0 {
			t.Errorf("after Wait, the killed VMM's cgroup is still there: %v", left)
		}
	}
}

// cgroupDirs finds the directories named name under /sys/fs/cgroup.
func cgroupDirs(t *testing.T, name string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir("/sys/fs/cgroup", func(p string, e fs.DirEntry, err error) error {
		if err == nil && e.IsDir() && e.Name() == name {
			out = append(out, p)
		}
		return nil
	})
	return out
}
