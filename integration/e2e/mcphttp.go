package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/knobs"
)

// mcpURLRE finds the address isopod-mcp --listen logs once it serves.
var mcpURLRE = regexp.MustCompile(`serving MCP over HTTP" url=(\S+)`)

// StartMCPHTTP starts this tree's isopod-mcp --listen on loopback with the
// token file tokens ("ROLE TOKEN" lines), over the private state root with
// no ready VMs and env added, and returns its URL. It is stopped with
// SIGTERM when the test ends, at most 30 s later; its stderr is logged
// when the test failed.
func StartMCPHTTP(t *testing.T, tokens string, env ...string) string {
	t.Helper()
	dir := t.TempDir()
	file := filepath.Join(dir, "tokens")
	if err := os.WriteFile(file, []byte(tokens), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(BinDir, "isopod-mcp"), "--listen", "127.0.0.1:0", "--token-file", file)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), knobs.AgentBin+"="+filepath.Join(BinDir, "isopod-agent"), knobs.ReadyVMs+"=0"), env...)
	logs := new(LockedBuffer)
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Error("isopod-mcp did not stop within 30 s of SIGTERM")
			cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("isopod-mcp stderr:\n%s", logs)
		}
	})
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if m := mcpURLRE.FindStringSubmatch(logs.String()); m != nil {
			return m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("isopod-mcp did not start listening:\n%s", logs)
		}
	}
}

// ConnectHTTP connects the SDK's client, as name, to the server at url with
// the bearer token; the session is closed when the test ends.
func ConnectHTTP(t *testing.T, name, url, token string) *mcp.ClientSession {
	t.Helper()
	client := mcp.NewClient(&mcp.Implementation{Name: name, Version: "0"}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: Bearer(token)}, MaxRetries: -1}, nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// Bearer is a transport that adds the token to every request.
type Bearer string

func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+string(b))
	return http.DefaultTransport.RoundTrip(r)
}
