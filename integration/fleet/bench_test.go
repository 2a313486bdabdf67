package fleet

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/mcpserver"
)

// TestBenchTransport measures warm runs through one HTTP server at
// concurrency 1, 2 and 4 against one stdio server at concurrency 1, in
// alternating rounds so that the machine's load hits both alike, and what
// the HTTP transport adds to a call: the client's latency less the run's
// own total_ms, and the latency of a call that starts no VM (stage_list).
// Ready VMs are off on both (ISOPOD_READY_VMS=0), so every run is a warm
// resume of the same snapshot. Run with
//
//	ISOPOD_BENCH=1 go test -run TestBenchTransport -v -timeout 60m ./integration/fleet/
func TestBenchTransport(t *testing.T) {
	if !e2e.BenchEnabled() {
		t.Skip("a benchmark: set ISOPOD_BENCH=1")
	}
	e2e.RequireVM(t)
	rounds, perSeries := benchInt("ISOPOD_BENCH_ROUNDS", 2), benchInt("ISOPOD_BENCH_CALLS", 8)
	hs := startServer(t, "http", newHome(t))
	hc := hs.mustConnect(t, runToken)
	sc, stdioHome := startStdio(t)
	run := map[string]any{"cmd": "true", "base": "base-min"}
	// Warm both up: the first run of a shape may boot cold while the
	// snapshot is built in the background.
	for _, c := range []*mcp.ClientSession{sc, hc.cs} {
		for range 3 {
			callOnce(t, c, run)
		}
	}
	series := map[string]*benchSeries{}
	add := func(name string, s *benchSeries) {
		if series[name] == nil {
			series[name] = &benchSeries{}
		}
		series[name].merge(s)
	}
	for r := 0; r < rounds; r++ {
		add("stdio c=1", measure(t, sc, 1, perSeries, run))
		for _, c := range []int{1, 2, 4} {
			add(fmt.Sprintf("http c=%d", c), measure(t, hc.cs, c, perSeries, run))
		}
		add("stdio stage_list", measureList(t, sc, 30))
		add("http stage_list", measureList(t, hc.cs, 30))
	}
	for _, name := range []string{"stdio c=1", "http c=1", "http c=2", "http c=4", "stdio stage_list", "http stage_list"} {
		t.Logf("%-17s %s", name, series[name])
	}
	s1, h1 := series["stdio c=1"], series["http c=1"]
	t.Logf("calls per minute, http c=1 / stdio c=1: %.2f", h1.perMinute()/s1.perMinute())
	t.Logf("added latency of HTTP on a warm run (p50 of call latency less total_ms): %d ms (stdio %d ms, http %d ms)",
		h1.p50(h1.overhead)-s1.p50(s1.overhead), s1.p50(s1.overhead), h1.p50(h1.overhead))
	t.Logf("stage_list p50: stdio %d ms, http %d ms", series["stdio stage_list"].p50(series["stdio stage_list"].latency),
		series["http stage_list"].p50(series["http stage_list"].latency))
	t.Logf("QEMU of a running base-min VM (512 MiB guest): %s", qemuRSS(t, hc.cs, hs.home))
	_ = stdioHome
}

func benchInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

// benchSeries is the calls of one series.
type benchSeries struct {
	calls    int
	failed   int // calls whose run failed (counted, not timed)
	elapsed  time.Duration
	latency  []int64 // ms, client side
	overhead []int64 // ms, latency less the report's total_ms
}

func (s *benchSeries) merge(o *benchSeries) {
	s.calls += o.calls
	s.failed += o.failed
	s.elapsed += o.elapsed
	s.latency = append(s.latency, o.latency...)
	s.overhead = append(s.overhead, o.overhead...)
}

func (s *benchSeries) perMinute() float64 { return float64(s.calls) / s.elapsed.Minutes() }

func (s *benchSeries) p50(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	c := slices.Clone(v)
	slices.Sort(c)
	return c[len(c)/2]
}

func (s *benchSeries) String() string {
	return fmt.Sprintf("%3d calls (%d failed) in %6.1f s: %6.1f calls/min, latency p50 %5d ms, latency less total_ms p50 %4d ms",
		s.calls, s.failed, s.elapsed.Seconds(), s.perMinute(), s.p50(s.latency), s.p50(s.overhead))
}

// measure runs n calls with c at once.
func measure(t *testing.T, cs *mcp.ClientSession, c, n int, args map[string]any) *benchSeries {
	s := &benchSeries{calls: n}
	var mu sync.Mutex
	next := make(chan struct{}, n)
	for range n {
		next <- struct{}{}
	}
	close(next)
	t0 := time.Now()
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range next {
				lat, total, ok := callOnce(t, cs, args)
				mu.Lock()
				if ok {
					s.latency = append(s.latency, lat)
					s.overhead = append(s.overhead, lat-total)
				} else {
					s.failed++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	s.elapsed = time.Since(t0)
	return s
}

// measureList times n stage_list calls, which start no VM.
func measureList(t *testing.T, cs *mcp.ClientSession, n int) *benchSeries {
	s := &benchSeries{calls: n}
	t0 := time.Now()
	for range n {
		c0 := time.Now()
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpserver.ToolStageList, Arguments: map[string]any{}})
		if err != nil || res.IsError {
			t.Fatalf("stage_list: %v %v", err, res)
		}
		s.latency = append(s.latency, time.Since(c0).Milliseconds())
	}
	s.elapsed = time.Since(t0)
	return s
}

// callOnce runs one sandbox_run and returns its latency and total_ms; a
// run that failed (a loaded machine times guests out) is logged and
// counted by the caller.
func callOnce(t *testing.T, cs *mcp.ClientSession, args map[string]any) (latency, total int64, ok bool) {
	t0 := time.Now()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpserver.ToolSandboxRun, Arguments: args})
	if err != nil {
		t.Fatalf("sandbox_run: %v", err)
	}
	if res.IsError {
		t.Logf("a run failed: %.200s", text(res))
		return 0, 0, false
	}
	rep := report(t, res)
	return time.Since(t0).Milliseconds(), rep.TotalMS, true
}

// startStdio starts isopod-mcp on stdio over a state root of its own.
func startStdio(t *testing.T) (*mcp.ClientSession, string) {
	home := newHome(t)
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"))
	cmd.Env, cmd.Dir = serverEnv(t, home), t.TempDir()
	stderr := &e2e.LockedBuffer{}
	cmd.Stderr = stderr
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-bench", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("stdio server: %v\n%s", err, stderr)
	}
	t.Cleanup(func() {
		cs.Close()
		if left := e2e.VMMsOf(home); len(left) > 0 {
			t.Errorf("the stdio server left QEMU %v", left)
		}
	})
	return cs, home
}

// qemuRSS samples the resident memory of a running VM's QEMU.
func qemuRSS(t *testing.T, cs *mcp.ClientSession, home string) string {
	done := make(chan struct{})
	go func() {
		defer close(done)
		cs.CallTool(context.Background(), &mcp.CallToolParams{Name: mcpserver.ToolSandboxRun,
			Arguments: map[string]any{"cmd": "sleep 6", "base": "base-min"}})
	}()
	defer func() { <-done }()
	if !waitFor(60*time.Second, func() bool { return len(e2e.VMMsOf(home)) > 0 }) {
		return "not sampled (no VM)"
	}
	time.Sleep(3 * time.Second)
	var out []string
	for _, pid := range e2e.VMMsOf(home) {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
		for _, line := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(line, "VmRSS:") || strings.HasPrefix(line, "VmHWM:") {
				out = append(out, strings.Join(strings.Fields(line), " "))
			}
		}
	}
	return strings.Join(out, ", ")
}
