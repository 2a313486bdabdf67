package netstack

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/flightrec/flightrectest"
	"isopod/internal/testnet"
)

// countingServer serves h on loopback (over TLS when tlsOn, with HTTP/2
// cleartext otherwise), counting connections and the Hosts it was asked
// for.
type countingServer struct {
	addr  netip.AddrPort
	conns atomic.Int32
	mu    sync.Mutex
	hosts []string
}

func (c *countingServer) seen() (int, []string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return int(c.conns.Load()), append([]string(nil), c.hosts...)
}

func newCountingServer(t *testing.T, tlsOn bool) *countingServer {
	t.Helper()
	c := &countingServer{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.hosts = append(c.hosts, r.Host)
		c.mu.Unlock()
		io.WriteString(w, "host="+r.Host)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			c.conns.Add(1)
		}
	}
	if tlsOn {
		srv.StartTLS()
	} else {
		var p http.Protocols
		p.SetHTTP1(true)
		p.SetUnencryptedHTTP2(true)
		srv.Config.Protocols = &p
		srv.Start()
	}
	t.Cleanup(srv.Close)
	c.addr = netip.MustParseAddrPort(srv.Listener.Addr().String())
	return c
}

// filteredStack runs a stack whose policy is a Filter allowing ok.example
// (pinned to 203.0.113.10), with port 80 and 443 sent to local servers.
func filteredStack(t *testing.T, web, tlsSrv netip.AddrPort) (*testGuest, *flightrectest.Recorder) {
	t.Helper()
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
	}
	rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"ok.example"}})
	if err != nil {
		t.Fatal(err)
	}
	f, err := egress.NewFilter(egress.FilterConfig{Rules: rules, Lookup: lookup})
	if err != nil {
		t.Fatal(err)
	}
	f.Pin("ok.example", []netip.Addr{netip.MustParseAddr("203.0.113.10")})
	rec := &flightrectest.Recorder{}
	dir := t.TempDir()
	s, err := Start(Config{Socket: filepath.Join(dir, "n.sock"), Policy: &portRedirect{inner: f, to: map[uint16]netip.AddrPort{80: web, 443: tlsSrv}},
		Recorder: rec, DNS: ResolverHandler(f), ResolvConf: filepath.Join(dir, "none")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return newTestGuest(t, s), rec
}

// portRedirect sends allowed connections to a local server by port.
type portRedirect struct {
	inner egress.Sniffer
	to    map[uint16]netip.AddrPort
}

func (p *portRedirect) Decide(f egress.Flow) egress.Verdict { return p.inner.Decide(f) }

func (p *portRedirect) Sniff(f egress.Flow) egress.Verdict {
	v := p.inner.Sniff(f)
	if v.Allow {
		v.Dial = p.to[f.Dst.Port()]
	}
	return v
}

// exchange sends raw bytes on a fresh guest connection and returns all it
// reads back until the stack closes (or resets) the connection.
func exchange(t *testing.T, g *testGuest, dst, send string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := g.dial(ctx, dst)
	if err != nil {
		t.Fatalf("dial %s: %v", dst, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, send); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	return string(b), err
}

func findReason(evs []flightrec.Event, reason, host string) *flightrec.Event {
	for i := range evs {
		if evs[i].Reason == reason && evs[i].Host == host {
			return &evs[i]
		}
	}
	return nil
}

// TestSniffEveryRequest: on port 80 every name of every request is judged
// before the server sees it.
func TestSniffEveryRequest(t *testing.T) {
	web := newCountingServer(t, false)
	g, rec := filteredStack(t, web.addr, web.addr)
	const ok = "GET /a HTTP/1.1\r\nHost: ok.example\r\n\r\n"
	tests := []struct {
		name, send string
		served     []string // Hosts the server was asked for
		reply      string   // a prefix of what the guest reads
		refused    string   // the name of the refusal record ("" for none)
		reason     string
	}{
		{"request line and Host disagree", "GET http://ok.example/b HTTP/1.1\r\nHost: evil.example\r\nConnection: close\r\n\r\n",
			nil, "HTTP/1.1 403 Forbidden", "evil.example", egress.ReasonHostMismatch},
		{"request line elsewhere", "GET http://evil.example/b HTTP/1.1\r\nHost: ok.example\r\nConnection: close\r\n\r\n",
			nil, "HTTP/1.1 403 Forbidden", "evil.example", egress.ReasonHostMismatch},
		{"pipelined", ok + "GET /b HTTP/1.1\r\nHost: evil.example\r\n\r\n",
			[]string{"ok.example"}, "HTTP/1.1 200 OK", "evil.example", egress.ReasonHostMismatch},
		{"smuggled in a chunked body", "POST / HTTP/1.1\r\nHost: ok.example\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n0\r\n\r\n" + "GET /b HTTP/1.1\r\nHost: evil.example\r\n\r\n",
			nil, "HTTP/1.1 403 Forbidden", "ok.example", egress.ReasonMalformed},
		{"kept alive", ok + ok + "GET /c HTTP/1.1\r\nHost: ok.example\r\nConnection: close\r\n\r\n",
			[]string{"ok.example", "ok.example", "ok.example"}, "HTTP/1.1 200 OK", "", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec.Reset()
			before, hostsBefore := web.seen()
			got, _ := exchange(t, g, "203.0.113.10:80", tt.send)
			if !strings.HasPrefix(got, tt.reply) {
				t.Errorf("guest read %q; want it to start %q", got, tt.reply)
			}
			if strings.Contains(got, "evil.example") {
				t.Errorf("guest read an answer for evil.example: %q", got)
			}
			_, hosts := web.seen()
			if served := hosts[len(hostsBefore):]; strings.Join(served, ",") != strings.Join(tt.served, ",") {
				t.Errorf("server was asked for %q; want %q", served, tt.served)
			}
			if n, _ := web.seen(); tt.served == nil && n != before {
				t.Errorf("the server saw %d connections for a refused request", n-before)
			}
			want := 1
			if tt.reason != "" && tt.served != nil {
				want = 2 // the allowed connection and the refused request
			}
			evs := rec.Wait(want)
			if len(evs) != want {
				t.Errorf("%d records; want %d: %+v", len(evs), want, evs)
			}
			if tt.reason != "" {
				if ev := findReason(evs, tt.reason, tt.refused); ev == nil || ev.Allowed || ev.Port != 80 {
					t.Errorf("no refusal %s %q in %+v", tt.reason, tt.refused, evs)
				}
			}
		})
	}
}

// TestSniffTLSBeforeDial: a ClientHello for another name is refused before
// the stack dials, so the server never sees a connection.
func TestSniffTLSBeforeDial(t *testing.T) {
	tlsSrv := newCountingServer(t, true)
	g, rec := filteredStack(t, tlsSrv.addr, tlsSrv.addr)
	got, err := exchange(t, g, "203.0.113.10:443", string(testnet.ClientHello(t, "evil.example")))
	if got != "" || err == nil {
		t.Errorf("fronted hello: read %q, %v; want a reset", got, err)
	}
	if n, _ := tlsSrv.seen(); n != 0 {
		t.Errorf("the server saw %d connections for a refused hello", n)
	}
	if ev := findReason(rec.Wait(1), egress.ReasonSNIMismatch, "evil.example"); ev == nil {
		t.Errorf("no sni_mismatch record: %+v", rec.Wait(1))
	}
	// The right name gets through to a real TLS handshake.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := g.dial(ctx, "203.0.113.10:443")
	if err != nil {
		t.Fatal(err)
	}
	tc := tls.Client(c, &tls.Config{ServerName: "ok.example", InsecureSkipVerify: true})
	defer tc.Close()
	tc.SetDeadline(time.Now().Add(5 * time.Second))
	if err := tc.Handshake(); err != nil {
		t.Errorf("handshake for the allowed name: %v", err)
	}
}

// TestSniffH2C: HTTP/2 cleartext with prior knowledge; every HEADERS
// frame's :authority is judged.
func TestSniffH2C(t *testing.T) {
	web := newCountingServer(t, false)
	g, rec := filteredStack(t, web.addr, web.addr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := g.dial(ctx, "203.0.113.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, http2.ClientPreface)
	fr := http2.NewFramer(c, bufio.NewReader(c))
	fr.WriteSettings()
	var hb strings.Builder
	enc := hpack.NewEncoder(&hb)
	headers := func(stream uint32, authority string) {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "http"}, {":authority", authority}, {":path", "/"}} {
			enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: []byte(hb.String()), EndStream: true, EndHeaders: true})
	}
	headers(1, "ok.example")
	// Read until the first response's data arrives.
	gotData := false
	for !gotData {
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatalf("reading the answer to the allowed request: %v", err)
		}
		if d, ok := f.(*http2.DataFrame); ok && strings.Contains(string(d.Data()), "host=ok.example") {
			gotData = true
		}
		if s, ok := f.(*http2.SettingsFrame); ok && !s.IsAck() {
			fr.WriteSettingsAck()
		}
	}
	headers(3, "evil.example")
	for {
		if _, err := fr.ReadFrame(); err != nil {
			break // reset
		}
	}
	if _, hosts := web.seen(); strings.Join(hosts, ",") != "ok.example" {
		t.Errorf("the server was asked for %q; want only ok.example", hosts)
	}
	if ev := findReason(rec.Wait(2), egress.ReasonHostMismatch, "evil.example"); ev == nil {
		t.Errorf("no refusal of the second stream: %+v", rec.Wait(2))
	}
}
