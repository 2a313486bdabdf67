package mcpserver

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"isopod/internal/testnet"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Test tokens, one per role.
const (
	runToken   = "run-token-0123456789abcdef"
	adminToken = "admin-token-0123456789abcdef"
)

func testTokens(t testing.TB) *Tokens {
	t.Helper()
	tk, err := ParseTokens(strings.NewReader("# test tokens\nrun " + runToken + "\n\nadmin " + adminToken + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// httpServer is a Server on a loopback listener.
type httpServer struct {
	srv    *Server
	url    string             // the MCP endpoint
	stop   context.CancelFunc // stops it, as SIGTERM does
	served chan error         // Serve's return, once it has
}

// startHTTP serves cfg on 127.0.0.1 (TLS with tlsCfg when set) until the
// test ends.
func startHTTP(t testing.TB, cfg Config, tlsCfg *tls.Config) *httpServer {
	t.Helper()
	cfg.Remote, cfg.NoStartupGC = true, true
	if cfg.GCEvery == 0 {
		cfg.GCEvery = -1
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln, srv.Handler(testTokens(t)), tlsCfg) }()
	scheme := "http://"
	if tlsCfg != nil {
		scheme = "https://"
	}
	h := &httpServer{srv: srv, url: scheme + ln.Addr().String() + MCPPath, stop: cancel, served: make(chan error, 1)}
	go func() {
		err := <-done
		h.served <- err
		close(h.served)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-h.served:
			if err != nil {
				t.Errorf("serve: %v", err)
			}
		case <-time.After(20 * time.Second):
			t.Error("the HTTP server did not stop")
		}
	})
	return h
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
	return b.next.RoundTrip(r)
}

// httpClient is an HTTP client that sends token (none when empty).
func httpClient(token string, rt http.RoundTripper) *http.Client {
	if rt == nil {
		rt = http.DefaultTransport
	}
	return &http.Client{Transport: bearer{token, rt}}
}

// connectHTTP connects the SDK's client to url with token, under the
// SDK's default protocol version (2026-07-28) and without reconnecting.
func connectHTTP(t testing.TB, url, token string, rt http.RoundTripper) (*session, error) {
	t.Helper()
	return connectHTTPAs(t, url, token, rt, "", -1)
}

// connectHTTPAs is connectHTTP under protocol version (empty: the SDK's
// default), reconnecting a dropped stream up to retries times.
func connectHTTPAs(t testing.TB, url, token string, rt http.RoundTripper, version string, retries int) (*session, error) {
	t.Helper()
	s := &session{progress: make(chan *mcp.ProgressNotificationParams, 1000)}
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-http-test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			s.progress <- r.Params
		},
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cs, err := client.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: httpClient(token, rt), MaxRetries: retries},
		&mcp.ClientSessionOptions{ProtocolVersion: version})
	if err != nil {
		return nil, err
	}
	s.cs = cs
	t.Cleanup(func() { cs.Close() })
	return s, nil
}

func mustConnectHTTP(t testing.TB, url, token string) *session {
	t.Helper()
	s, err := connectHTTP(t, url, token, nil)
	if err != nil {
		t.Fatalf("connecting to %s: %v", url, err)
	}
	return s
}

// testCert makes a self-signed certificate for 127.0.0.1 and localhost,
// written as PEM files in dir, and a client transport that trusts it.
func testCert(t testing.TB, dir string) (certFile, keyFile string, client http.RoundTripper) {
	t.Helper()
	c := testnet.SelfSigned(t, "127.0.0.1", "localhost")
	certFile, keyFile = testnet.WritePEM(t, dir, c)
	pool := x509.NewCertPool()
	pool.AddCert(c.Leaf)
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = &tls.Config{RootCAs: pool}
	return certFile, keyFile, tr
}
