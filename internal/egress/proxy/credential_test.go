package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec/flightrectest"
)

// TestProxyHandsCredentialRequests: an absolute-form request for the
// credential endpoint's address reaches its handler with its method,
// target and body; one for another port of the gateway is judged as
// egress; the proxy refuses the pinned host itself.
func TestProxyHandsCredentialRequests(t *testing.T) {
	endpoint := netip.MustParseAddrPort("10.0.2.2:3129")
	pins, err := egress.ParsePins([]string{"secret.wild.example"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"*.wild.example", "secret.wild.example"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := egress.NewFilter(egress.FilterConfig{Rules: rules, Pinned: pins,
		Lookup: func(context.Context, string) ([]netip.Addr, error) {
			return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	rec := &flightrectest.Recorder{}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "endpoint %s %s %s", r.Method, r.URL.Path, b)
	})
	p, err := New(Config{Filter: f, Recorder: rec, Credential: handler, CredentialAddr: endpoint,
		Dial: func(context.Context, string, string) (net.Conn, error) {
			return nil, fmt.Errorf("no dial in this test")
		}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeHTTPProxy(l)
	t.Cleanup(p.Close)

	send := func(req string) string {
		t.Helper()
		c, err := net.Dial("tcp", l.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		io.WriteString(c, req)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	got := send("POST http://10.0.2.2:3129/gh/repos/x?y=1 HTTP/1.1\r\nHost: 10.0.2.2:3129\r\nContent-Length: 4\r\n\r\nbody")
	if !strings.HasPrefix(got, "HTTP/1.1 200") || !strings.HasSuffix(got, "endpoint POST /gh/repos/x body") {
		t.Errorf("request for the endpoint through the proxy: %q", got)
	}
	if got := send("GET http://10.0.2.2:3130/gh/ HTTP/1.1\r\nHost: 10.0.2.2:3130\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 403") {
		t.Errorf("another port of the gateway: %q; want a refusal", got)
	}
	if got := send("GET http://secret.wild.example/ HTTP/1.1\r\nHost: secret.wild.example\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 403") || !strings.Contains(got, egress.ReasonPinnedCredential) {
		t.Errorf("the pinned host through the proxy: %q", got)
	}
	if got := send("CONNECT secret.wild.example:443 HTTP/1.1\r\nHost: secret.wild.example:443\r\n\r\n"); !strings.HasPrefix(got, "HTTP/1.1 403") {
		t.Errorf("CONNECT to the pinned host: %q", got)
	}
	if ev := rec.Find(flightrectest.Reason(egress.ReasonPinnedCredential, "secret.wild.example")); ev == nil || ev.Allowed {
		t.Errorf("no pinned_credential_host record: %+v", ev)
	}
	c, code := socksDial(t, startSOCKS(t, p), "secret.wild.example", 443)
	c.Close()
	if code != 2 {
		t.Errorf("SOCKS5 CONNECT to the pinned host: reply %d; want 2 (not allowed)", code)
	}
}

// startSOCKS serves p's SOCKS5 proxy on loopback.
func startSOCKS(t *testing.T, p *Server) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.ServeSOCKS(l)
	return l.Addr().String()
}
