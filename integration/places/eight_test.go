package places

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
	"isopod/internal/ledger"
)

// memAvailableMiB is the host's MemAvailable.
func memAvailableMiB(t *testing.T) int {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var kib int
		if _, err := fmt.Sscanf(sc.Text(), "MemAvailable: %d kB", &kib); err == nil {
			return kib >> 10
		}
	}
	t.Fatal("no MemAvailable in /proc/meminfo")
	return 0
}

// rssMiB is the resident memory of the QEMU processes of vms.
func rssMiB(t *testing.T, vms []string) int {
	t.Helper()
	kib := 0
	for _, vm := range vms {
		for _, pid := range e2e.QEMUPIDs(t, vm) {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
			for _, line := range strings.Split(string(b), "\n") {
				var n int
				if _, err := fmt.Sscanf(line, "VmRSS: %d kB", &n); err == nil {
					kib += n
				}
			}
		}
	}
	return kib >> 10
}

// TestEightSessions: on a state root of eight places, eight small
// sessions start at once, each answers an exec, a ninth finds no place
// and answers busy, and once all stop no QEMU is left. It logs how long
// that took and the host memory the eight used.
func TestEightSessions(t *testing.T) {
	e2e.RequireVM(t)
	if testing.Short() {
		t.Skip("eight VMs at once")
	}
	const n = 8
	env := []string{knobs.WarmPool + "=off", knobs.MaxVMs + "=8"}
	before := memAvailableMiB(t)
	t0 := time.Now()
	ids, vms := make([]string, n), make([]string, n)
	rs := e2e.Parallel(n, func(i int) *e2e.Result {
		return e2e.Isopod(t, env, "session", "start", "--no-network", "--mem-mib", "128", "--base", "base-min", "--timeout-s", "300")
	})
	var failed bool
	for i, r := range rs {
		ids[i], vms[i] = e2e.Str(r.JSON, "session_id"), e2e.Str(r.JSON, "vm_id")
		if ids[i] != "" {
			id, vm := ids[i], vms[i]
			t.Cleanup(func() {
				stopSession(t, id)
				waitNoQEMU(t, vm)
			})
		}
		if r.Code != 0 || r.JSON["ok"] != true {
			t.Errorf("session %d did not start:\n%s", i, r)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	started := time.Since(t0)
	used, rss := before-memAvailableMiB(t), rssMiB(t, vms)
	if h := held(t); h[ledger.KindSession] != n {
		t.Errorf("the ledger holds %v; want %d sessions", h, n)
	}
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			r := e2e.Isopod(t, nil, "session", "exec", id, "--", "echo", fmt.Sprint("hi ", i))
			if r.Code != 0 || e2e.Str(r.JSON, "stdout") != fmt.Sprintf("hi %d\n", i) {
				t.Errorf("exec in session %d:\n%s", i, r)
			}
		})
	}
	wg.Wait()
	execs := time.Since(t0) - started
	ninth := e2e.Isopod(t, env, "session", "start", "--no-network", "--mem-mib", "128", "--timeout-s", "3")
	wantBusy(t, "a ninth session on eight places", ninth)
	t1 := time.Now()
	e2e.Parallel(n, func(i int) *e2e.Result { return e2e.Isopod(t, nil, "session", "stop", ids[i]) })
	for _, vm := range vms {
		waitNoQEMU(t, vm)
	}
	t.Logf("eight sessions: started in %s, an exec in each in %s, all stopped in %s; host memory used %d MiB (MemAvailable), QEMU RSS %d MiB",
		started.Round(time.Millisecond), execs.Round(time.Millisecond), time.Since(t1).Round(time.Millisecond), used, rss)
}
