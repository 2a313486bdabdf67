package places

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
	"isopod/internal/ledger"
)

// oneVM is a state root of one VM place; its VMs boot cold, so that no
// snapshot build takes a place.
var oneVM = []string{knobs.WarmPool + "=off", knobs.MaxVMs + "=1"}

// startSession starts a small session under env; the test's end stops it
// and checks that its QEMU is gone.
func startSession(t *testing.T, env []string, args ...string) (id string) {
	t.Helper()
	args = append([]string{"session", "start", "--no-network", "--mem-mib", "128"}, args...)
	r := e2e.Isopod(t, env, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v failed:\n%s", args, r)
	}
	id = e2e.Str(r.JSON, "session_id")
	vm := e2e.Str(r.JSON, "vm_id")
	t.Cleanup(func() {
		stopSession(t, id)
		if vm != "" {
			waitNoQEMU(t, vm)
		}
	})
	return id
}

// stopSession stops session id (again: a no-op).
func stopSession(t *testing.T, id string) {
	t.Helper()
	e2e.Isopod(t, nil, "session", "stop", id)
}

// waitNoQEMU fails unless vm's QEMU is gone within 30 s; it kills any left.
func waitNoQEMU(t *testing.T, vm string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for len(e2e.QEMUPIDs(t, vm)) > 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	if pids := e2e.QEMUPIDs(t, vm); len(pids) != 0 {
		t.Errorf("QEMU %v of %s left behind", pids, vm)
		for _, p := range pids {
			unix.Kill(p, unix.SIGKILL)
		}
	}
}

// held is what the state root's ledger says is held, by kind.
func held(t *testing.T) map[ledger.Kind]int {
	t.Helper()
	entries, err := ledger.Read(filepath.Join(e2e.HomeDir, "ledger"))
	if err != nil {
		t.Fatal(err)
	}
	n := map[ledger.Kind]int{}
	for _, e := range entries {
		for _, it := range e.Items {
			n[it.Kind]++
		}
	}
	return n
}

// wantBusy checks that r is the CLI's busy failure: exit 1, one JSON
// object of class unavailable saying busy.
func wantBusy(t *testing.T, what string, r *e2e.Result) {
	t.Helper()
	if r.Code != 1 || r.JSON["ok"] != false || r.JSON["class"] != "unavailable" || !strings.Contains(e2e.Str(r.JSON, "error"), "busy") {
		t.Errorf("%s: want exit 1 and a busy (unavailable) failure, got:\n%s", what, r)
	}
}

// TestSessionHoldsThePlace: on a state root of one VM place, a running
// session holds it: a run waits its own timeout for it and answers busy;
// once the session stops, a run gets the place.
func TestSessionHoldsThePlace(t *testing.T) {
	e2e.RequireVM(t)
	id := startSession(t, oneVM)
	if n := held(t); n[ledger.KindSession] != 1 {
		t.Fatalf("the ledger holds %v; want the session's place", n)
	}
	t0 := time.Now()
	r := e2e.Isopod(t, oneVM, "run", "--no-network", "--timeout-s", "8", "--", "true")
	waited := time.Since(t0)
	wantBusy(t, "a run while the session holds the only place", r)
	if waited < 8*time.Second {
		t.Errorf("the run answered after %s; want it to wait its 8 s timeout first", waited)
	}
	if !strings.Contains(string(r.Stderr), "waiting for a VM place") {
		t.Errorf("the run did not say on stderr that it waits:\n%s", r.Stderr)
	}
	stopSession(t, id)
	if r := e2e.Isopod(t, oneVM, "run", "--no-network", "--timeout-s", "120", "--", "true"); r.Code != 0 || r.JSON["ok"] != true {
		t.Errorf("a run once the session stopped:\n%s", r)
	}
	if n := held(t); len(n) != 0 {
		t.Errorf("the ledger still holds %v once every VM is gone", n)
	}
}

// TestMCPAndSessionsShare: an MCP server, with its own admission, and the
// CLI's sessions share one state root's place: each waits for the other's
// VM and answers busy.
func TestMCPAndSessionsShare(t *testing.T) {
	e2e.RequireVM(t)
	cs := e2e.StartMCP(t, "isopod-places", "", nil, append(oneVM, knobs.ReadyVMs+"=0")...)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	run := func(cmd string, timeoutS int) *mcp.CallToolResult {
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_run", Arguments: map[string]any{
			"cmd": cmd, "base": "base-min", "network": false, "mem_mib": 128, "timeout_s": timeoutS}})
		if err != nil {
			t.Fatalf("sandbox_run %q: %v", cmd, err)
		}
		return res
	}

	id := startSession(t, oneVM)
	if res := run("true", 8); !res.IsError || !strings.Contains(e2e.ToolText(res), "busy") {
		t.Errorf("sandbox_run while a session holds the place: %s; want busy", e2e.ToolText(res))
	}
	stopSession(t, id)
	if res := run("true", 120); res.IsError {
		t.Fatalf("sandbox_run once the session stopped: %s", e2e.ToolText(res))
	}

	// An MCP run holds the place: a session start waits its boot
	// timeout, then answers busy.
	done := make(chan *mcp.CallToolResult, 1)
	go func() { done <- run("sleep 25", 300) }()
	deadline := time.Now().Add(2 * time.Minute)
	for held(t)[ledger.KindRun] == 0 && time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
	}
	r := e2e.Isopod(t, oneVM, "session", "start", "--no-network", "--mem-mib", "128", "--timeout-s", "8")
	wantBusy(t, "a session start while an MCP run holds the place", r)
	if res := <-done; res.IsError {
		t.Errorf("the MCP run: %s", e2e.ToolText(res))
	}
}
