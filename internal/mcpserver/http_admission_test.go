package mcpserver

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/admission"
	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// TestHTTPAdmission: 20 calls at once against a host that runs 2 VMs and
// queues 4: 6 succeed (the 4 queued after progress said so), 14 are
// refused as busy at once, and nothing is left running.
func TestHTTPAdmission(t *testing.T) {
	t.Parallel()
	core, drv := newFakeCore(t)
	adm := mustAdmission(t, 2, 4)
	h := startHTTP(t, Config{Core: core, Admission: adm, ProgressInterval: time.Hour}, nil)
	s := mustConnectHTTP(t, h.url, runToken)
	type outcome struct {
		res     *mcp.CallToolResult
		err     error
		elapsed time.Duration
	}
	results := make([]outcome, 20)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{
				"cmd": "sleep 1", "base": "base-min", "network": false, "cwd": "/"}}
			p.SetProgressToken(fmt.Sprintf("call-%d", i))
			t0 := time.Now()
			res, err := s.cs.CallTool(context.Background(), p)
			results[i] = outcome{res, err, time.Since(t0)}
		}()
	}
	wg.Wait()
	queuedSaid := map[string]bool{}
	for len(s.progress) > 0 {
		p := <-s.progress
		if strings.Contains(p.Message, "queued") {
			queuedSaid[p.ProgressToken.(string)] = true
		}
	}
	var ok, busy, okQueued int
	for i, o := range results {
		switch {
		case o.err == nil && !o.res.IsError:
			ok++
			if queuedSaid[fmt.Sprintf("call-%d", i)] {
				okQueued++
			}
		case o.err != nil && strings.Contains(o.err.Error(), "Service Unavailable"):
			busy++
			if o.elapsed > 3*time.Second {
				t.Errorf("call %d was refused only after %v", i, o.elapsed)
			}
		default:
			t.Errorf("call %d: %v %v", i, o.err, o.res)
		}
	}
	if ok != 6 || busy != 14 || okQueued != 4 {
		t.Errorf("%d succeeded (%d after a queued notice), %d busy; want 6 (4), 14", ok, okQueued, busy)
	}
	if st := adm.Stats(); st.Running != 0 || st.Queued != 0 {
		t.Errorf("admission after the calls: %+v", st)
	}
	if n := liveMachines(drv); n != 0 {
		t.Errorf("%d machines still run", n)
	}
}

func mustAdmission(t testing.TB, vms, queue int) *admission.Admission {
	t.Helper()
	a, err := admission.New(admission.Config{MaxVMs: vms, Queue: queue, MemoryBudgetMiB: 1 << 20, OverheadMiB: 256,
		MinMemMiB: sandbox.MinMemMiB, RunMemMiB: sandbox.DefaultMemMiB})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestHTTPBusyIs503: a refused call is HTTP 503 with Retry-After and a
// JSON-RPC error that says busy and unavailable; on stdio it is a tool
// error in the same words.
func TestHTTPBusyIs503(t *testing.T) {
	release := make(chan struct{})
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		select {
		case <-release:
		case <-ctx.Done():
		}
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}}, nil
	}}
	adm := mustAdmission(t, 1, 0)
	h := startHTTP(t, Config{Core: core, Admission: adm}, nil)
	s := mustConnectHTTP(t, h.url, runToken)
	go s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{"cmd": "sleep 9"}})
	if !waitFor(10*time.Second, func() bool { return adm.Stats().Running == 1 }) {
		t.Fatal("the first call never ran")
	}
	req, _ := http.NewRequest("POST", h.url, strings.NewReader(`{"jsonrpc":"2.0","id":"b-1","method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"true"}}}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	resp, err := httpClient(runToken, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.Contains(string(body), "busy (unavailable)") || !strings.Contains(string(body), `"id":"b-1"`) {
		t.Errorf("HTTP %d, Retry-After %q, body %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	// stdio: the same refusal, as a tool error.
	st := connect(t, Config{Core: core, Admission: adm, NoStartupGC: true})
	res := st.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "sandbox_run busy (unavailable)") {
		t.Errorf("stdio: %s", resultText(res))
	}
	close(release)
}

// TestHTTPCancelTearsTheVMDown: a client that gives up a call over HTTP
// (the Go client closes the request; a client of an older protocol
// version sends notifications/cancelled in another POST) ends the run,
// and its VM is torn down.
func TestHTTPCancelTearsTheVMDown(t *testing.T) {
	core, drv := newFakeCore(t)
	adm := mustAdmission(t, 2, 2)
	h := startHTTP(t, Config{Core: core, Admission: adm}, nil)
	args := map[string]any{"cmd": "sleep 60", "base": "base-min", "network": false, "cwd": "/"}

	s := mustConnectHTTP(t, h.url, runToken)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: args})
		done <- err
	}()
	if !waitFor(20*time.Second, func() bool { return liveMachines(drv) == 1 }) {
		t.Fatal("the VM never started")
	}
	cancel()
	<-done
	if !waitFor(10*time.Second, func() bool { return liveMachines(drv) == 0 && adm.Stats().Running == 0 }) {
		t.Fatalf("after the client cancelled: %d machines, admission %+v", liveMachines(drv), adm.Stats())
	}

	// An older protocol version's client: the call, then a cancellation.
	post := func(body string) *http.Response {
		req, _ := http.NewRequest("POST", h.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
		resp, err := httpClient(runToken, nil).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	call, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 41, "method": "tools/call",
		"params": map[string]any{"name": ToolSandboxRun, "arguments": args}})
	streamed := make(chan string, 1)
	go func() {
		resp := post(string(call))
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		streamed <- string(b)
	}()
	if !waitFor(20*time.Second, func() bool { return liveMachines(drv) == 1 }) {
		t.Fatal("the second VM never started")
	}
	if resp := post(`{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":41,"reason":"test"}}`); resp.StatusCode != http.StatusAccepted {
		t.Errorf("cancellation: HTTP %d", resp.StatusCode)
	}
	if !waitFor(10*time.Second, func() bool { return liveMachines(drv) == 0 && adm.Stats().Running == 0 }) {
		t.Fatalf("after notifications/cancelled: %d machines, admission %+v", liveMachines(drv), adm.Stats())
	}
	select {
	case body := <-streamed:
		if strings.Contains(body, `"exit_code"`) {
			t.Errorf("a cancelled call got a run report: %.300s", body)
		}
	case <-time.After(15 * time.Second):
		t.Error("the cancelled call's response never ended")
	}
}
