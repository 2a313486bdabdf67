package warmpool

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// TestBenchReadyVMs measures, with ISOPOD_BENCH=1, one isopod-mcp with
// ready VMs against one with ISOPOD_READY_VMS=0, side by side on state
// roots of their own, calls alternating: MCP total_ms p50 of `true` on
// base-min (each server's snapshot built first), each pair once a ready
// VM waits and then back to back, then a waiting ready VM's idle cost, its QEMU's CPU time over 30 s. ISOPOD_BENCH_CALLS sets
// the calls per server (default 12).
func TestBenchReadyVMs(t *testing.T) {
	e2e.RequireVM(t)
	if !e2e.BenchEnabled() {
		t.Skip("a benchmark: set ISOPOD_BENCH=1")
	}
	n := 12
	if v, err := strconv.Atoi(os.Getenv("ISOPOD_BENCH_CALLS")); err == nil && v > 0 {
		n = v
	}
	envReady, envNone := warmHome(t), warmHome(t)
	ready := startMCP(t, append(envReady, "ISOPOD_READY_VMS=1"), "--max-vms", "2")
	none := startMCP(t, append(envNone, "ISOPOD_READY_VMS=0"), "--max-vms", "2")
	call := func(s *mcpServer, what string) map[string]any {
		rep, err := s.call(t, "sandbox_run", map[string]any{"cmd": "true", "base": "base-min"})
		if err != nil || rep["exit_code"] != float64(0) {
			t.Fatalf("%s: %v %v", what, err, rep)
		}
		return rep
	}
	for _, s := range []struct {
		s   *mcpServer
		env []string
	}{{ready, envReady}, {none, envNone}} {
		call(s.s, "first call")
		waitFor(t, "snapshot built in the background", 5*time.Minute, func() bool { return len(listSnapshots(t, s.env)) == 1 })
		call(s.s, "a resume, which makes the shape hot")
	}
	var withReady, without []int64
	served := 0
	for i := range n {
		waitFor(t, "ready VM", 3*time.Minute, func() bool { return ready.readyVMs(t) >= 1 })
		rep := call(none, fmt.Sprintf("call %d without ready VMs", i))
		without = append(without, int64(rep["total_ms"].(float64)))
		rep = call(ready, fmt.Sprintf("call %d with ready VMs", i))
		withReady = append(withReady, int64(rep["total_ms"].(float64)))
		if rep["ready_vm"] == true {
			served++
		}
	}
	a, b := p50(withReady), p50(without)
	t.Logf("BENCH MCP total_ms p50: ready VMs %d ms (%d of %d served by one), none %d ms, ratio %.2f; all %v / %v",
		a, served, n, b, float64(a)/float64(b), withReady, without)
	if float64(a) > 0.5*float64(b) {
		t.Errorf("ready VMs / none %.2f; want at most 0.5", float64(a)/float64(b))
	}

	// Back to back: each pair as soon as the last call was answered, so
	// that a call may come while its server still readies the next VM.
	withReady, without, served = nil, nil, 0
	for i := range n {
		rep := call(none, fmt.Sprintf("back-to-back call %d without ready VMs", i))
		without = append(without, int64(rep["total_ms"].(float64)))
		rep = call(ready, fmt.Sprintf("back-to-back call %d with ready VMs", i))
		withReady = append(withReady, int64(rep["total_ms"].(float64)))
		if rep["ready_vm"] == true {
			served++
		}
	}
	a, b = p50(withReady), p50(without)
	t.Logf("BENCH back to back, MCP total_ms p50: ready VMs %d ms (%d of %d served by one), none %d ms, ratio %.2f; all %v / %v",
		a, served, n, b, float64(a)/float64(b), withReady, without)

	waitFor(t, "ready VM", 3*time.Minute, func() bool { return ready.readyVMs(t) >= 1 })
	pids := e2e.VMMsOf(ready.home)
	if len(pids) != 1 {
		t.Fatalf("%d VMMs with one ready VM waiting", len(pids))
	}
	pct := idleCost(t, pids[0], 30*time.Second)
	if pct >= 2 {
		t.Errorf("a waiting ready VM's QEMU takes %.2f %% of a core; want under 2 %%", pct)
	}
}

// idleCost is the share of a core, in percent, pid takes over span.
func idleCost(t *testing.T, pid int, span time.Duration) float64 {
	t.Helper()
	c0, t0 := cpuTicks(t, pid), time.Now()
	time.Sleep(span) // the span the cost is measured over
	c1, el := cpuTicks(t, pid), time.Since(t0)
	pct := float64(c1-c0) / 100 / el.Seconds() * 100
	t.Logf("BENCH a waiting ready VM's QEMU: %.2f %% of a core over %v (%d ticks)", pct, el.Round(time.Second), c1-c0)
	return pct
}

// p50 is the median of xs.
func p50(xs []int64) int64 {
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// cpuTicks is pid's user and system time in clock ticks (1/100 s), from
// /proc/PID/stat.
func cpuTicks(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The fields after the command's closing parenthesis: state is the
	// first, utime the 12th, stime the 13th.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	u, _ := strconv.ParseInt(f[11], 10, 64)
	s, _ := strconv.ParseInt(f[12], 10, 64)
	return u + s
}
