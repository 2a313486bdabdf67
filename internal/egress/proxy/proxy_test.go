package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/flightrec/flightrectest"
	"isopod/internal/testnet"
)

// testFilter builds a Filter whose names resolve to documentation
// addresses.
func testFilter(t *testing.T, sw egress.Switches) *egress.Filter {
	t.Helper()
	rules, err := egress.ParseRules(sw)
	if err != nil {
		t.Fatal(err)
	}
	cfg := egress.FilterConfig{Rules: rules}
	table := map[string][]netip.Addr{
		"allowed.example": {netip.MustParseAddr("203.0.113.10")},
		"other.example":   {netip.MustParseAddr("203.0.113.10")},
		"lan.example":     {netip.MustParseAddr("192.168.77.10")},
	}
	cfg.Lookup = func(_ context.Context, name string) ([]netip.Addr, error) {
		if a, ok := table[name]; ok {
			return a, nil
		}
		return nil, egress.ErrNoSuchHost
	}
	f, err := egress.NewFilter(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// fixture is both proxies on loopback. The filter's names resolve to
// documentation addresses; the injected dialer sends those to local servers
// (port 80 and 8080: an HTTP server echoing Host, 443: a TLS server), which
// count the connections they accept and the Hosts they are asked for.
type fixture struct {
	httpAddr, socksAddr string
	rec                 *flightrectest.Recorder
	webConns, tlsConns  atomic.Int32
	mu                  sync.Mutex
	hosts               []string
}

func (f *fixture) served() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.hosts...)
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	fx := &fixture{rec: &flightrectest.Recorder{}}
	web := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fx.mu.Lock()
		fx.hosts = append(fx.hosts, r.Host)
		fx.mu.Unlock()
		fmt.Fprintf(w, "host=%s path=%s", r.Host, r.URL.Path)
	}))
	web.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			fx.webConns.Add(1)
		}
	}
	web.Start()
	t.Cleanup(web.Close)
	tlsSrv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "tls host=%s", r.Host)
	}))
	tlsSrv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			fx.tlsConns.Add(1)
		}
	}
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	routes := map[string]string{
		"203.0.113.10:80":   web.Listener.Addr().String(),
		"203.0.113.10:8080": web.Listener.Addr().String(),
		"203.0.113.10:443":  tlsSrv.Listener.Addr().String(),
		"198.51.100.10:80":  web.Listener.Addr().String(),
	}
	f := testFilter(t, egress.Switches{AllowHosts: []string{"allowed.example", "lan.example"}, AllowCIDRs: []string{"198.51.100.0/24"}})
	var d net.Dialer
	p, err := New(Config{Filter: f, Recorder: fx.rec, Dial: func(ctx context.Context, network, addr string) (net.Conn, error) {
		to, ok := routes[addr]
		if !ok {
			return nil, fmt.Errorf("test dialer: no route to %s", addr)
		}
		return d.DialContext(ctx, network, to)
	}})
	if err != nil {
		t.Fatal(err)
	}
	var addrs []string
	for _, serve := range []func(net.Listener) error{p.ServeHTTPProxy, p.ServeSOCKS} {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go serve(l)
		addrs = append(addrs, l.Addr().String())
	}
	t.Cleanup(p.Close)
	fx.httpAddr, fx.socksAddr = addrs[0], addrs[1]
	return fx
}

func proxyFixture(t *testing.T) (httpAddr, socksAddr string, rec *flightrectest.Recorder) {
	fx := newFixture(t)
	return fx.httpAddr, fx.socksAddr, fx.rec
}

func TestHTTPProxy(t *testing.T) {
	httpAddr, _, rec := proxyFixture(t)
	pu, _ := url.Parse("http://" + httpAddr)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(pu),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
	get := func(u string) (int, string, error) {
		resp, err := client.Get(u)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), nil
	}

	if code, body, err := get("http://allowed.example/x"); err != nil || code != 200 || body != "host=allowed.example path=/x" {
		t.Errorf("absolute-form GET of an allowed name: %d %q %v", code, body, err)
	}
	if code, body, err := get("https://allowed.example/y"); err != nil || code != 200 || body != "tls host=allowed.example" {
		t.Errorf("CONNECT to an allowed name: %d %q %v", code, body, err)
	}
	if code, body, err := get("http://other.example/"); err != nil || code != 403 || !strings.Contains(body, "not_allowed") || !strings.Contains(body, "--allow-host other.example") {
		t.Errorf("name not allowed: %d %q %v", code, body, err)
	}
	if _, _, err := get("https://other.example/"); err == nil {
		t.Error("CONNECT to a name not allowed succeeded")
	}
	if code, body, err := get("http://203.0.113.10/"); err != nil || code != 403 || !strings.Contains(body, egress.ReasonLiteral) {
		t.Errorf("literal address (an allowed name's): %d %q %v", code, body, err)
	}
	if code, _, err := get("http://198.51.100.10/"); err != nil || code != 200 {
		t.Errorf("literal address in an allowed CIDR: %d %v", code, err)
	}
	if code, body, err := get("http://lan.example/"); err != nil || code != 403 || !strings.Contains(body, egress.ReasonPrivate) {
		t.Errorf("allowed name on a private address: %d %q %v", code, body, err)
	}

	// Raw requests: https:// absolute form, and a CONNECT tunnel that
	// fronts another name in its SNI.
	raw := func(req string) string {
		c, err := net.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, req)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	if got := raw("GET https://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 501") || !strings.Contains(got, "use CONNECT") {
		t.Errorf("https:// absolute form: %q", got)
	}
	if got := raw("GARBAGE\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 400") {
		t.Errorf("malformed request: %q", got)
	}
	if ev := rec.Find(flightrectest.Reason(egress.ReasonBadRequest, "")); ev == nil || ev.Allowed {
		t.Errorf("no bad_request record for the malformed request: %+v", ev)
	}
	// An allowed name whose server cannot be reached: allowed, but recorded
	// as dial_failed with the cause.
	if code, _, err := get("http://allowed.example:8081/"); err != nil || code != 502 {
		t.Errorf("unreachable allowed destination: %d %v; want 502", code, err)
	}
	if ev := rec.Find(flightrectest.Reason(egress.ReasonDialFailed, "allowed.example")); ev == nil || !ev.Allowed || ev.Port != 8081 || ev.Error == "" {
		t.Errorf("dial_failed record: %+v", ev)
	}
	fronted := raw("CONNECT allowed.example:443 HTTP/1.1\r\nHost: allowed.example:443\r\n\r\n" + string(testnet.ClientHello(t, "other.example")))
	if !strings.HasPrefix(fronted, "HTTP/1.1 200") || strings.Contains(fronted[len("HTTP/1.1 200 Connection established\r\n\r\n"):], "\x16\x03") {
		t.Errorf("fronted CONNECT got a server answer: %q", fronted)
	}
	// The tunnel's record follows its close, which raw does not wait for.
	if ev := rec.Await(func(ev flightrec.Event) bool {
		return ev.Reason == egress.ReasonSNIMismatch && ev.Host == "other.example" && ev.Proto == egress.ProtoHTTPProxy
	}); ev == nil || ev.Allowed {
		t.Errorf("no refused sni_mismatch record for the fronted tunnel: %+v", ev)
	}
	if ev := rec.Find(flightrectest.Host("allowed.example")); ev == nil || !ev.Allowed || ev.BytesDown == 0 || ev.Dst.String() != "203.0.113.10" {
		t.Errorf("allowed record: %+v", ev)
	}
}

// socksDial performs a SOCKS5 CONNECT by name and returns the reply code.
func socksDial(t *testing.T, addr, host string, port uint16) (net.Conn, byte) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := []byte{5, 1, 0, 5, 1, 0}
	if a, err := netip.ParseAddr(host); err == nil {
		req = append(req, 1)
		req = append(req, a.AsSlice()...)
	} else {
		req = append(req, 3, byte(len(host)))
		req = append(req, host...)
	}
	req = append(req, byte(port>>8), byte(port))
	c.Write(req)
	var resp [12]byte
	if _, err := io.ReadFull(c, resp[:12]); err != nil {
		t.Fatalf("socks %s: %v", host, err)
	}
	if resp[0] != 5 || resp[1] != 0 || resp[2] != 5 {
		t.Fatalf("socks %s: reply % x", host, resp)
	}
	return c, resp[3]
}

func TestSOCKSProxy(t *testing.T) {
	_, socksAddr, rec := proxyFixture(t)
	c, code := socksDial(t, socksAddr, "allowed.example", 80)
	if code != 0 {
		t.Fatalf("CONNECT allowed.example:80: code %d", code)
	}
	io.WriteString(c, "GET /s HTTP/1.1\r\nHost: allowed.example\r\nConnection: close\r\n\r\n")
	b, _ := io.ReadAll(c)
	c.Close()
	if !bytes.Contains(b, []byte("host=allowed.example path=/s")) {
		t.Errorf("through SOCKS: %q", b)
	}
	for _, tt := range []struct {
		host string
		port uint16
		code byte
	}{
		{"other.example", 443, 2},
		{"203.0.113.10", 443, 2},
		{"lan.example", 80, 2},
		{"198.51.100.10", 80, 0},
	} {
		c, code := socksDial(t, socksAddr, tt.host, tt.port)
		c.Close()
		if code != tt.code {
			t.Errorf("CONNECT %s:%d: code %d; want %d", tt.host, tt.port, code, tt.code)
		}
	}
	// Host header fronting inside an allowed tunnel.
	c, _ = socksDial(t, socksAddr, "allowed.example", 80)
	io.WriteString(c, "GET / HTTP/1.1\r\nHost: other.example\r\n\r\n")
	b, _ = io.ReadAll(c)
	c.Close()
	if !bytes.HasPrefix(b, []byte("HTTP/1.1 403 Forbidden")) || bytes.Contains(b, []byte("host=")) {
		t.Errorf("fronted SOCKS tunnel got %q; want the proxy's 403", b)
	}
	// The tunnel's record follows its close, which the test does not wait for.
	if ev := rec.Await(flightrectest.Reason(egress.ReasonHostMismatch, "other.example")); ev == nil || ev.Allowed || ev.Proto != egress.ProtoSOCKS || ev.Port != 80 {
		t.Errorf("no refused host_mismatch record for the fronted SOCKS tunnel: %+v", ev)
	}
}

func TestReadSOCKSRequest(t *testing.T) {
	tests := []struct {
		in   []byte
		want SOCKSRequest
		ok   bool
	}{
		{[]byte{5, 1, 0, 5, 1, 0, 3, 3, 'a', '.', 'b', 0, 80}, SOCKSRequest{Cmd: 1, Host: "a.b", Port: 80}, true},
		{[]byte{5, 2, 2, 0, 5, 1, 0, 1, 203, 0, 113, 10, 1, 187}, SOCKSRequest{Cmd: 1, Host: "203.0.113.10", Port: 443}, true},
		{[]byte{5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0}, SOCKSRequest{Cmd: 3, Host: "0.0.0.0", Port: 0}, true},
		{[]byte{4, 1, 0, 80}, SOCKSRequest{}, false},            // SOCKS4
		{[]byte{5, 1, 2}, SOCKSRequest{}, false},                // username/password only
		{[]byte{5, 1, 0, 5, 1, 0, 9, 1}, SOCKSRequest{}, false}, // unknown address type
		{[]byte{5, 1, 0, 5, 1, 0, 3, 10, 'a'}, SOCKSRequest{}, false},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		got, err := ReadSOCKSRequest(bufio.NewReader(bytes.NewReader(tt.in)), &out)
		if (err == nil) != tt.ok || (tt.ok && got != tt.want) {
			t.Errorf("% x: %+v, %v; want %+v ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

// TestConfigTakesParsedFilter: the proxies judge by the run's Filter, built
// over parsed rules; no Config field carries rules as text to parse again.
func TestConfigTakesParsedFilter(t *testing.T) {
	var _ *egress.Filter = Config{}.Filter // compile-time: the parsed policy itself
	ct := reflect.TypeFor[Config]()
	for i := range ct.NumField() {
		f := ct.Field(i)
		if f.Type.Kind() == reflect.String || (f.Type.Kind() == reflect.Slice && f.Type.Elem().Kind() == reflect.String) {
			t.Errorf("Config.%s is %s: the proxies take the parsed filter, not text", f.Name, f.Type)
		}
	}
}
