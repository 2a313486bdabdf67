package warmpool

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// On a host of one VM place (the default on one core), the server's
// background work (its snapshot build, its ready VM) gives its place to
// every call: calls one after the other and at the same time are all
// answered, over stdio and over HTTP.

// callBound is how long one call may take here: a cold boot or a resume
// under TCG on a loaded host, and never a wait for background work.
const callBound = 3 * time.Minute

const placesToken = "warmpool-places-token-0123456789"

var mcpURLRE = regexp.MustCompile(`serving MCP over HTTP" url=(\S+)`)

// startMCPHTTP starts isopod-mcp --listen on loopback with env (ISOPOD_HOME
// first) and args, and connects to it. Whatever happens, no VMM of its
// state root outlives the test.
func startMCPHTTP(t *testing.T, env []string, args ...string) *mcpServer {
	t.Helper()
	s := &mcpServer{home: strings.TrimPrefix(env[0], "ISOPOD_HOME="), logs: new(e2e.LockedBuffer)}
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("run "+placesToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"), append([]string{"--listen", "127.0.0.1:0", "--token-file", tokens}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), knobs.AgentBin+"="+filepath.Join(e2e.BinDir, "isopod-agent")), env...)
	cmd.Stderr = s.logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if s.cs != nil {
			s.cs.Close()
		}
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Errorf("isopod-mcp did not stop within 30 s of SIGTERM")
			cmd.Process.Kill()
			<-done
		}
		for _, pid := range e2e.VMMsOf(s.home) {
			t.Errorf("QEMU %d outlived the server", pid)
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("isopod-mcp stderr:\n%s", s.logs)
		}
	})
	var url string
	waitFor(t, "server address", time.Minute, func() bool {
		if m := mcpURLRE.FindStringSubmatch(s.logs.String()); m != nil {
			url = m[1]
		}
		return url != ""
	})
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-warmpool-test", Version: "0"}, nil)
	hc := &http.Client{Transport: bearer{placesToken}}
	cs, err := client.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connecting to isopod-mcp: %v", err)
	}
	s.cs = cs
	return s
}

// bearer adds the token to every request.
type bearer struct{ token string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return http.DefaultTransport.RoundTrip(r)
}

// boundedRun is sandbox_run of cmd on base-min, which must be answered
// within callBound and exit 0; it returns the report.
func (s *mcpServer) boundedRun(t *testing.T, what, cmd string) map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), callBound)
	defer cancel()
	t0 := time.Now()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_run", Arguments: map[string]any{"cmd": cmd, "base": "base-min"}})
	if err != nil {
		t.Errorf("%s: no answer within %v: %v (admission %s)", what, callBound, err, admissionLine(s))
		return nil
	}
	var rep map[string]any
	if m, ok := res.StructuredContent.(map[string]any); ok {
		rep = m
	}
	if res.IsError || rep == nil || rep["exit_code"] != float64(0) {
		t.Errorf("%s: error %v, report %v", what, res.IsError, rep)
		return nil
	}
	t.Logf("%s: %v, path %v, ready_vm %v", what, time.Since(t0).Round(time.Millisecond), rep["path"], rep["ready_vm"])
	return rep
}

// admissionLine is the server's start-up admission log line.
func admissionLine(s *mcpServer) string {
	for _, l := range strings.Split(s.logs.String(), "\n") {
		if strings.Contains(l, "msg=admission") {
			return l
		}
	}
	return "?"
}

func TestMCPOnePlace(t *testing.T) {
	e2e.RequireVM(t)
	for _, transport := range []string{"stdio", "http"} {
		t.Run(transport, func(t *testing.T) {
			env := warmHome(t)
			var s *mcpServer
			if transport == "stdio" {
				s = startMCP(t, env, "--max-vms", "1")
			} else {
				s = startMCPHTTP(t, env, "--max-vms", "1")
			}
			// One after the other: the first call's snapshot is built in
			// the background, and the next calls come while it is (or a
			// ready VM waits).
			for i := range 3 {
				s.boundedRun(t, fmt.Sprintf("call %d", i+1), "true")
			}
			// Two at once, twice: once at a moment the server picked, and
			// once while a ready VM holds the one place (made after a call
			// that resumed the snapshot).
			for round := range 2 {
				if round == 1 {
					waitFor(t, "snapshot", callBound, func() bool { return len(listSnapshots(t, env)) == 1 })
					if rep := s.boundedRun(t, "call after the snapshot", "true"); rep != nil && rep["path"] != "warm" {
						t.Errorf("call after the snapshot: path %v; want warm", rep["path"])
					}
					waitFor(t, "ready VM", callBound, func() bool { return s.readyVMs(t) >= 1 })
				}
				var wg sync.WaitGroup
				for i := range 2 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						s.boundedRun(t, fmt.Sprintf("round %d, concurrent call %d", round+1, i+1), "true")
					}()
				}
				wg.Wait()
			}
			if n := len(listSnapshots(t, env)); n != 1 {
				t.Errorf("%d snapshots; want the one built in the background", n)
			}
		})
	}
}
