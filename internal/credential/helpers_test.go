package credential

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"fmt"
	"io"
	"isopod/internal/testnet"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// testCA is a certificate authority of a test's own.
type testCA = testnet.CA

func newTestCA(t *testing.T) *testCA { return testnet.NewCA(t) }

// upstreamTLS starts an HTTPS server for localhost with a certificate of
// ca, serving h.
func upstreamTLS(t *testing.T, ca *testCA, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Leaf(t, "localhost")}}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes tests make
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

// authorised reports how r presents testSecret, "" when it does not (or
// presents more than one credential).
func authorised(r *http.Request) string {
	auth := r.Header.Values("Authorization")
	key := r.Header.Values("X-Api-Key")
	switch {
	case len(auth)+len(key) != 1:
		return ""
	case len(key) == 1 && key[0] == testSecret:
		return "header"
	case len(auth) == 1 && auth[0] == "Bearer "+testSecret:
		return "bearer"
	case len(auth) == 1 && auth[0] == "Basic "+base64.StdEncoding.EncodeToString([]byte("bot:"+testSecret)):
		return "basic"
	}
	return ""
}

// seen is what the upstream saw of one request.
type seen struct {
	Method, URI string
	Header      http.Header
	Body        int
	Chunked     bool
}

// recordingUpstream is a test host that answers only requests carrying
// the secret, and remembers what it saw.
type recordingUpstream struct {
	mu   sync.Mutex
	reqs []seen
	// release lets /stream send its second part.
	release chan struct{}
}

func (u *recordingUpstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n, _ := io.Copy(io.Discard, r.Body)
	u.mu.Lock()
	u.reqs = append(u.reqs, seen{r.Method, r.RequestURI, r.Header.Clone(), int(n), len(r.TransferEncoding) > 0})
	u.mu.Unlock()
	kind := authorised(r)
	if kind == "" {
		http.Error(w, "no or wrong credential", http.StatusUnauthorized)
		return
	}
	switch {
	case strings.HasPrefix(r.URL.Path, "/redirect"):
		w.Header().Set("Location", "https://elsewhere.example/next")
		w.WriteHeader(http.StatusFound)
		return
	case strings.HasPrefix(r.URL.Path, "/stream"):
		io.WriteString(w, "first;")
		http.NewResponseController(w).Flush()
		select {
		case <-u.release:
			io.WriteString(w, "second")
		case <-time.After(10 * time.Second):
		}
		return
	case strings.HasPrefix(r.URL.Path, "/cut"):
		io.WriteString(w, "part")
		http.NewResponseController(w).Flush()
		panic(http.ErrAbortHandler)
	case strings.HasPrefix(r.URL.Path, "/slow"):
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
		return
	}
	w.Header().Set("Connection", "X-Private")
	w.Header().Set("X-Private", "hop")
	w.Header().Set("X-Kind", kind)
	fmt.Fprintf(w, "%s %s body=%d", r.Method, r.RequestURI, n)
}

// requests returns what the upstream saw so far.
func (u *recordingUpstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.reqs...)
}

// testGateway is a gateway under test, served on loopback.
type testGateway struct {
	*Gateway
	url  string // http://127.0.0.1:port
	logs *bytes.Buffer

	mu       sync.Mutex
	events   []Event
	recorded chan Event // each event, as recorded
}

// newTestGateway resolves aliases from a store of decls (alias ->
// declaration, "%CA%" standing for the CA file) and serves their
// endpoint, dialling localhost:443 to up.
func newTestGateway(t *testing.T, up *httptest.Server, ca *testCA, decls map[string]string, mod func(*GatewayConfig)) *testGateway {
	t.Helper()
	dir := t.TempDir()
	caFile := ""
	if ca != nil {
		caFile = writeFile(t, dir, "ca.pem", string(ca.PEM), 0o644)
	}
	var entries, names []string
	for name, d := range decls {
		entries = append(entries, fmt.Sprintf("%q: %s", name, strings.ReplaceAll(d, "%CA%", caFile)))
		names = append(names, name)
	}
	store := writeFile(t, dir, StoreFile, `{"version": 1, "credentials": {`+strings.Join(entries, ",")+`}}`, 0o600)
	creds, err := Resolve(store, names, Operator, envOf(map[string]string{"TOK": testSecret}), nil)
	if err != nil {
		t.Fatal(err)
	}
	tg := &testGateway{logs: &bytes.Buffer{}, recorded: make(chan Event, 1000)}
	cfg := GatewayConfig{Credentials: creds, Record: tg.record,
		Logger: slog.New(slog.NewTextHandler(&lockedWriter{w: tg.logs}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr != "localhost:443" || up == nil {
				return nil, fmt.Errorf("test dialer: no route to %s", addr)
			}
			var d net.Dialer
			return d.DialContext(ctx, network, up.Listener.Addr().String())
		}}
	if mod != nil {
		mod(&cfg)
	}
	if tg.Gateway, err = NewGateway(cfg); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(tg.Gateway)
	t.Cleanup(srv.Close)
	t.Cleanup(func() { tg.Gateway.Close() })
	tg.url = srv.URL
	return tg
}

func (tg *testGateway) record(e Event) {
	tg.mu.Lock()
	defer tg.mu.Unlock()
	tg.events = append(tg.events, e)
	tg.recorded <- e
}

// nextEvent returns the next event recorded (the gateway records a
// request's once its answer is sent), waiting a while for it.
func (tg *testGateway) nextEvent(t *testing.T) Event {
	t.Helper()
	select {
	case e := <-tg.recorded:
		return e
	case <-time.After(10 * time.Second):
		t.Fatal("no event recorded")
	}
	return Event{}
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// raw sends one request as written (target, headers and body verbatim)
// to the gateway and returns the response and its body.
func (tg *testGateway) raw(t *testing.T, method, target, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(tg.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	req := method + " " + target + " HTTP/1.1\r\nHost: gateway\r\nConnection: close\r\n"
	for _, h := range headers {
		req += h + "\r\n"
	}
	if _, err := io.WriteString(c, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatalf("%s %s: %v", method, target, err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// client is an HTTP client of the gateway that follows no redirect.
var client = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       30 * time.Second,
}
