package fleet

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/mcpserver"
)

// Test tokens, one per role.
const (
	runToken   = "fleet-run-token-0123456789"
	adminToken = "fleet-admin-token-0123456789"
)

// server is one isopod-mcp --listen process with a state root of its own.
type server struct {
	name, url, home string
	cmd             *exec.Cmd
	stderr          *e2e.LockedBuffer
	client          *http.Client // trusts the server's certificate, if any
}

// newHome makes a private state root linked to the installed images,
// removed when the test ends.
func newHome(t testing.TB) string {
	t.Helper()
	h, err := e2e.NewHome("", e2e.SourceHome)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	})
	return h.Dir
}

// serverEnv is every server's environment on top of the test's: its own
// state root, the built agent, no ready VMs (so that VM counts are
// exact), and no registry credentials.
func serverEnv(t testing.TB, home string) []string {
	return append(os.Environ(), "ISOPOD_HOME="+home, "ISOPOD_AGENT_BIN="+filepath.Join(e2e.BinDir, "isopod-agent"),
		"ISOPOD_READY_VMS=0", "DOCKER_CONFIG="+t.TempDir())
}

var urlRE = regexp.MustCompile(`serving MCP over HTTP" url=(\S+)`)

// startServer starts isopod-mcp --listen on loopback over home with args
// added, and stops it (and checks that it left no VMM) when the test ends.
func startServer(t testing.TB, name, home string, args ...string) *server {
	t.Helper()
	return startServerEnv(t, name, home, nil, args...)
}

// startServerEnv is startServer with env added to the server's.
func startServerEnv(t testing.TB, name, home string, env []string, args ...string) *server {
	t.Helper()
	dir := t.TempDir()
	tokens := filepath.Join(dir, "tokens")
	if err := os.WriteFile(tokens, []byte("run "+runToken+"\nadmin "+adminToken+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := &server{name: name, home: home, stderr: &e2e.LockedBuffer{}, client: &http.Client{}}
	argv := append([]string{"--listen", "127.0.0.1:0", "--token-file", tokens}, args...)
	s.cmd = exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"), argv...)
	s.cmd.Dir, s.cmd.Env, s.cmd.Stderr = dir, append(serverEnv(t, home), env...), s.stderr
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.stop(t) })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if m := urlRE.FindStringSubmatch(s.stderr.String()); m != nil {
			s.url = m[1]
			return s
		}
		if time.Now().After(deadline) {
			t.Fatalf("server %s did not start:\n%s", name, s.stderr)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop ends the server with SIGTERM and fails the test if a VMM of its
// state root outlives it.
func (s *server) stop(t testing.TB) {
	if s.cmd.ProcessState != nil {
		return // stopped already
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- s.cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Errorf("server %s did not stop within 30 s of SIGTERM", s.name)
		s.cmd.Process.Kill()
		<-done
	}
	if left := e2e.VMMsOf(s.home); len(left) > 0 {
		t.Errorf("server %s left QEMU processes %v", s.name, left)
		for _, p := range left {
			syscall.Kill(p, syscall.SIGKILL)
		}
	}
	if t.Failed() {
		t.Logf("server %s stderr (tail):\n%s", s.name, tail(s.stderr.String(), 6000))
		if os.Getenv("FLEET_DEBUG") != "" {
			logs, _ := filepath.Glob(filepath.Join(s.home, "vms", "*", "console.log"))
			for _, l := range logs {
				b, _ := os.ReadFile(l)
				t.Logf("%s:\n%s", l, tail(string(b), 3000))
			}
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// bearer adds a token to every request.
type bearer struct {
	token string
	next  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.token != "" {
		r.Header.Set("Authorization", "Bearer "+b.token)
	}
	next := b.next
	if next == nil {
		next = http.DefaultTransport
	}
	return next.RoundTrip(r)
}

// client is a Go SDK client session with a server.
type client struct {
	cs *mcp.ClientSession

	mu       sync.Mutex // guards progress
	progress map[any][]string
}

// connect opens a session with token.
func (s *server) connect(t testing.TB, token string) (*client, error) {
	c := &client{progress: map[any][]string{}}
	mc := mcp.NewClient(&mcp.Implementation{Name: "isopod-fleet-test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			c.mu.Lock()
			c.progress[r.Params.ProgressToken] = append(c.progress[r.Params.ProgressToken], r.Params.Message)
			c.mu.Unlock()
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	hc := &http.Client{Transport: bearer{token, s.client.Transport}}
	cs, err := mc.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: s.url, HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, err
	}
	c.cs = cs
	t.Cleanup(func() { cs.Close() })
	return c, nil
}

func (s *server) mustConnect(t testing.TB, token string) *client {
	t.Helper()
	c, err := s.connect(t, token)
	if err != nil {
		t.Fatalf("connecting to %s: %v", s.name, err)
	}
	return c
}

// call runs a tool; a protocol error fails the test.
func (c *client) call(t testing.TB, ctx context.Context, tool string, args map[string]any, token any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: tool, Arguments: args}
	if token != nil {
		p.SetProgressToken(token)
	}
	res, err := c.cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

func (c *client) progressOf(token any) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.progress[token]...)
}

func text(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// report decodes a sandbox_run result; a tool error fails the test.
func report(t testing.TB, r *mcp.CallToolResult) mcpserver.RunResult {
	t.Helper()
	if r.IsError {
		t.Fatalf("tool error: %s", text(r))
	}
	var rep mcpserver.RunResult
	raw, _ := json.Marshal(r.StructuredContent)
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report: %v (%s)", err, raw)
	}
	return rep
}

// stageRegistry is an in-process OCI registry on loopback that counts the
// manifest reads of each tag.
type stageRegistry struct {
	repo string // REGISTRY/REPO for --stage-registry

	mu    sync.Mutex // guards gets
	gets  map[string]int
	inner http.Handler
}

func startRegistry(t testing.TB) *stageRegistry {
	t.Helper()
	r := &stageRegistry{gets: map[string]int{}, inner: registry.New(registry.Logger(log.New(io.Discard, "", 0)))}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	r.repo = strings.TrimPrefix(srv.URL, "http://") + "/isopod/stages"
	return r
}

func (r *stageRegistry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodGet {
		if _, tag, ok := strings.Cut(req.URL.Path, "/manifests/"); ok {
			r.mu.Lock()
			r.gets[tag]++
			r.mu.Unlock()
		}
	}
	r.inner.ServeHTTP(w, req)
}

// manifestGets is how often a tag's manifest was read.
func (r *stageRegistry) manifestGets(tag string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.gets[tag]
}

// waitFor polls cond until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if cond() {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}

// tlsClient trusts certFile.
func tlsClient(t testing.TB, certFile string) *http.Client {
	t.Helper()
	pem, err := os.ReadFile(certFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509Pool(t, pem)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	return &http.Client{Transport: tr}
}
