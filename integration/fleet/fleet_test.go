package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/mcpserver"
)

// TestStagesTravelBetweenHosts: a stage committed on A is pushed to the
// registry; B (over TLS) lacks it, pulls it once for two calls that name
// it at the same time, and runs them; a later call by id pulls nothing.
func TestStagesTravelBetweenHosts(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	a := startServer(t, "A", newHome(t), "--stage-registry", reg.repo, "--push-commits")
	cert, key := makeCert(t, t.TempDir())
	b := startServer(t, "B", newHome(t), "--stage-registry", reg.repo, "--tls-cert", cert, "--tls-key", key)
	b.client = tlsClient(t, cert)
	if !strings.HasPrefix(b.url, "https://") {
		t.Fatalf("B serves %s, not HTTPS", b.url)
	}
	ctx := context.Background()

	ca := a.mustConnect(t, runToken)
	committed := report(t, ca.call(t, ctx, mcpserver.ToolSandboxRun, map[string]any{
		"cmd": "echo hello-from-A > /root/greeting", "base": "base-min", "commit_as": "fleet/greet", "timeout_s": 300,
	}, nil))
	if committed.StageID == "" || committed.Registry == nil || len(committed.Registry.Pushed) != 2 {
		t.Fatalf("the commit on A was not pushed by id and label: stage %q, registry %+v", committed.StageID, committed.Registry)
	}
	labelTag := ""
	for _, ref := range committed.Registry.Pushed {
		if _, tag, _ := strings.Cut(strings.TrimPrefix(ref, reg.repo), ":"); strings.HasPrefix(tag, "label-") {
			labelTag = tag
		}
	}

	cb := b.mustConnect(t, runToken)
	results := make([]mcpserver.RunResult, 2)
	var wg sync.WaitGroup
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = report(t, cb.call(t, ctx, mcpserver.ToolSandboxRun, map[string]any{
				"stage": "fleet/greet", "cmd": "cat /root/greeting", "timeout_s": 300,
			}, nil))
		}()
	}
	wg.Wait()
	pulled := 0
	for i, r := range results {
		if r.Stdout != "hello-from-A\n" {
			t.Errorf("call %d on B: stdout %q", i, r.Stdout)
		}
		if r.ForkedFrom != committed.StageID {
			t.Errorf("call %d on B forked %q, not %s", i, r.ForkedFrom, committed.StageID)
		}
		if r.Registry != nil && r.Registry.Pulled != "" {
			pulled++
		}
	}
	if n := reg.manifestGets(labelTag); n != 1 || pulled == 0 {
		t.Errorf("B read the label's manifest %d times (want 1); %d results say they pulled", n, pulled)
	}
	again := report(t, cb.call(t, ctx, mcpserver.ToolSandboxRun, map[string]any{
		"stage": committed.StageID, "cmd": "cat /root/greeting", "timeout_s": 300,
	}, nil))
	if again.Registry != nil || reg.manifestGets(committed.StageID) != 0 {
		t.Errorf("a stage B has was pulled again: %+v, %d reads", again.Registry, reg.manifestGets(committed.StageID))
	}
}

// TestListenerRefusals: start-up refuses plain HTTP off loopback, calls
// without the right token are refused, and host paths are off.
func TestListenerRefusals(t *testing.T) {
	e2e.RequireVM(t)
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"), "--listen", "0.0.0.0:0", "--token-file", "/nonexistent")
	cmd.Env = serverEnv(t, newHome(t))
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "--tls-cert") {
		t.Errorf("plain HTTP on every interface: %v\n%s", err, out)
	}

	s := startServer(t, "A", newHome(t))
	for _, tok := range []string{"", "not-a-token-of-this-server"} {
		if _, err := s.connect(t, tok); err == nil {
			t.Errorf("token %q: connected", tok)
		}
		req, _ := http.NewRequest("POST", s.url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		resp, err := (&http.Client{Transport: bearer{tok, nil}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("token %q: HTTP %d, want 401", tok, resp.StatusCode)
		}
	}
	c := s.mustConnect(t, runToken)
	ctx := context.Background()
	hostFile := filepath.Join(t.TempDir(), "input.txt")
	os.WriteFile(hostFile, []byte("server file\n"), 0o644)
	res := c.call(t, ctx, mcpserver.ToolSandboxRun, map[string]any{"cmd": "cat", "base": "base-min", "stdin_file": hostFile}, nil)
	if !res.IsError || !strings.Contains(text(res), "--host-io-root") {
		t.Errorf("stdin_file over HTTP: %s", text(res))
	}
	if res := c.call(t, ctx, mcpserver.ToolVMGC, map[string]any{"keep_last": 5}, nil); !res.IsError || !strings.Contains(text(res), "admin") {
		t.Errorf("vm_gc with a run token: %s", text(res))
	}
}

// TestReadFilesAndCancelOverHTTP: read_files brings a binary guest file
// back intact; a call the client gives up has its VM torn down.
func TestReadFilesAndCancelOverHTTP(t *testing.T) {
	e2e.RequireVM(t)
	s := startServer(t, "A", newHome(t))
	c := s.mustConnect(t, runToken)
	ctx := context.Background()
	rep := report(t, c.call(t, ctx, mcpserver.ToolSandboxRun, map[string]any{
		"cmd": "head -c 300000 /dev/urandom > /root/r.bin && sha256sum /root/r.bin", "base": "base-min", "read_files": []string{"/root/r.bin"},
	}, nil))
	if len(rep.Files) != 1 || rep.Files[0].Encoding != "base64" {
		t.Fatalf("files %+v", rep.Files)
	}
	data, err := base64.StdEncoding.DecodeString(rep.Files[0].Content)
	sum := sha256.Sum256(data)
	if err != nil || len(data) != 300000 || !strings.HasPrefix(rep.Stdout, hex.EncodeToString(sum[:])) {
		t.Errorf("read back %d bytes (%v), sha256 %x; the guest said %q", len(data), err, sum, rep.Stdout)
	}

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := c.cs.CallTool(cctx, &mcp.CallToolParams{Name: mcpserver.ToolSandboxRun,
			Arguments: map[string]any{"cmd": "sleep 600", "base": "base-min", "timeout_s": 900}})
		done <- err
	}()
	if !waitFor(120*time.Second, func() bool { return len(e2e.VMMsOf(s.home)) > 0 }) {
		t.Fatal("the VM never started")
	}
	time.Sleep(2 * time.Second) // well into the command
	cancel()
	<-done
	if !waitFor(30*time.Second, func() bool { return len(e2e.VMMsOf(s.home)) == 0 }) {
		t.Fatalf("QEMU %v still runs 30 s after the client cancelled", e2e.VMMsOf(s.home))
	}
}

// TestAdmissionOnARealHost: 20 calls at once against a host that runs 2
// VMs and queues 4: 6 succeed (the 4 queued ones after their progress
// said so), 14 are refused as busy at once, and no VM is left once the
// background snapshot build that follows them is done.
func TestAdmissionOnARealHost(t *testing.T) {
	e2e.RequireVM(t)
	s := startServer(t, "C", newHome(t), "--max-vms", "2", "--queue", "4")
	c := s.mustConnect(t, runToken)
	type outcome struct {
		res     *mcp.CallToolResult
		err     error
		elapsed time.Duration
	}
	out := make([]outcome, 20)
	var wg sync.WaitGroup
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := &mcp.CallToolParams{Name: mcpserver.ToolSandboxRun, Arguments: map[string]any{
				"cmd": "sleep 2", "base": "base-min", "timeout_s": 600}}
			p.SetProgressToken(fmt.Sprintf("call-%d", i))
			t0 := time.Now()
			res, err := c.cs.CallTool(context.Background(), p)
			out[i] = outcome{res, err, time.Since(t0)}
		}()
	}
	wg.Wait()
	var ok, busy, queued int
	for i, o := range out {
		switch {
		case o.err == nil && !o.res.IsError:
			ok++
			for _, m := range c.progressOf(fmt.Sprintf("call-%d", i)) {
				if strings.Contains(m, "queued") {
					queued++
					break
				}
			}
		case o.err != nil && strings.Contains(o.err.Error(), "Service Unavailable"):
			busy++
			if o.elapsed > 5*time.Second {
				t.Errorf("call %d refused only after %v", i, o.elapsed)
			}
		default:
			msg := fmt.Sprint(o.err)
			if o.res != nil {
				msg = text(o.res)
			}
			t.Errorf("call %d: %s", i, msg)
		}
	}
	if ok != 6 || busy != 14 || queued != 4 {
		t.Errorf("%d succeeded (%d after a queued notice), %d busy; want 6 (4), 14", ok, queued, busy)
	}
	// The shape's snapshot is built in the background once a place is
	// free; then nothing runs.
	var res *mcp.CallToolResult
	if !waitFor(3*time.Minute, func() bool {
		res = c.call(t, context.Background(), mcpserver.ToolVMList, map[string]any{}, nil)
		return !strings.Contains(text(res), `"live":true`) && len(e2e.VMMsOf(s.home)) == 0
	}) {
		t.Errorf("a VM is still live 3 minutes after the calls: %s (QEMU %v)", text(res), e2e.VMMsOf(s.home))
	}
}

// TestReadyVMsEndWithTheServer: with ready VMs on, the server keeps a
// restored VM for a shape it ran, within its admission, and SIGTERM ends
// it with the server.
func TestReadyVMsEndWithTheServer(t *testing.T) {
	e2e.RequireVM(t)
	home := newHome(t)
	s := startServerEnv(t, "R", home, []string{"ISOPOD_READY_VMS=1"}, "--max-vms", "2")
	c := s.mustConnect(t, runToken)
	args := map[string]any{"cmd": "true", "base": "base-min", "timeout_s": 600}
	// The first run of a shape builds its snapshot in the background; a
	// later one resumes it and makes the shape hot; the next can claim a
	// ready VM. Between calls the server has time to make one.
	readyUsed := false
	for i := 0; i < 8 && !readyUsed; i++ {
		readyUsed = report(t, c.call(t, context.Background(), mcpserver.ToolSandboxRun, args, nil)).ReadyVM
		waitFor(30*time.Second, func() bool { return len(e2e.VMMsOf(home)) > 0 })
		time.Sleep(3 * time.Second)
	}
	if !readyUsed {
		t.Logf("server log:\n%s", tail(s.stderr.String(), 4000))
		t.Skip("no ready VM was made here (the warm pool may be off or the host too busy); nothing to check")
	}
	if !waitFor(60*time.Second, func() bool { return len(e2e.VMMsOf(home)) > 0 }) {
		t.Fatal("no ready VM was made again after one was used")
	}
	s.stop(t) // fails the test if a QEMU of home outlives the server
}
