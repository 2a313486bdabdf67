package netstack

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
)

func TestConfigValidate(t *testing.T) {
	sock := "/tmp/x.sock"
	tests := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{Socket: sock}, true},
		{"no socket", Config{}, false},
		{"relative socket", Config{Socket: "x.sock"}, false},
		{"long socket", Config{Socket: "/" + strings.Repeat("a", 120)}, false},
		{"v6 guest", Config{Socket: sock, GuestAddr: netip.MustParsePrefix("fd00::2/64")}, false},
		{"/31", Config{Socket: sock, GuestAddr: netip.MustParsePrefix("10.0.2.2/31")}, false},
		{"gateway outside", Config{Socket: sock, Gateway: netip.MustParseAddr("10.0.3.1")}, false},
		{"gateway is guest", Config{Socket: sock, Gateway: netip.MustParseAddr("10.0.2.2")}, false},
		{"guest is broadcast", Config{Socket: sock, GuestAddr: netip.MustParsePrefix("10.0.2.3/30")}, false},
		{"other subnet", Config{Socket: sock, GuestAddr: netip.MustParsePrefix("172.30.0.10/24"), Gateway: netip.MustParseAddr("172.30.0.1")}, true},
		{"multicast MAC", Config{Socket: sock, GuestMAC: net.HardwareAddr{1, 0, 0, 0, 0, 1}}, false},
		{"tiny MTU", Config{Socket: sock, MTU: 100}, false},
		{"negative flows", Config{Socket: sock, MaxFlows: -1}, false},
	}
	for _, tt := range tests {
		err := tt.cfg.Validate()
		if (err == nil) != tt.ok {
			t.Errorf("%s: Validate() = %v; want ok=%v", tt.name, err, tt.ok)
		}
		if err != nil && !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("%s: error %v is not ErrInvalidArgument", tt.name, err)
		}
	}
}

// redirectPolicy stands in for a filtering policy: it sends some public
// destinations to local servers (through Verdict.Dial), judges port 8080 by
// the HTTP Host header (through Sniff), and leaves the rest to PublicOnly.
type redirectPolicy struct {
	to    map[netip.AddrPort]netip.AddrPort
	sniff netip.AddrPort // where port-8080 connections that pass go
	base  egress.PublicOnly
}

func (p *redirectPolicy) Decide(f egress.Flow) egress.Verdict {
	if f.Proto == egress.ProtoDNS && f.Host == "blocked.example" {
		return egress.Verdict{Reason: "name_not_allowed"}
	}
	if f.Proto != egress.ProtoDNS && f.Dst.Port() == 8080 {
		return egress.Verdict{Allow: true, Sniff: true}
	}
	if to, ok := p.to[f.Dst]; ok {
		return egress.Verdict{Allow: true, Reason: "redirected", Dial: to}
	}
	return p.base.Decide(f)
}

func (p *redirectPolicy) Sniff(f egress.Flow) egress.Verdict {
	if f.Host != "good.example" {
		return egress.Verdict{Reason: "host_mismatch", Host: f.Host}
	}
	return egress.Verdict{Allow: true, Reason: "host_ok", Host: f.Host, Dial: p.sniff}
}

// localDNS serves name -> 203.0.113.10 on loopback and returns a resolver
// that uses only it.
func localDNS(t *testing.T) *net.Resolver {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg).SetReply(q)
		switch qq := q.Question[0]; {
		case qq.Name == "test.example." && qq.Qtype == dns.TypeA:
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.ParseIP("203.0.113.10")})
		case qq.Name == "test.example.":
		default:
			m.Rcode = dns.RcodeNameError
		}
		w.WriteMsg(m)
	})}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })
	addr := pc.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}

func udpEcho(t *testing.T) netip.AddrPort {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			pc.WriteTo(buf[:n], from)
		}
	}()
	return netip.MustParseAddrPort(pc.LocalAddr().String())
}

func readLog(t *testing.T, path string) []flightrec.Event {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var evs []flightrec.Event
	for line := range strings.SplitSeq(strings.TrimSpace(string(b)), "\n") {
		var ev flightrec.Event
		if err := json.Unmarshal([]byte(line), &ev); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		evs = append(evs, ev)
	}
	return evs
}

func findEvent(evs []flightrec.Event, proto, dst string, port uint16) *flightrec.Event {
	for i := range evs {
		if evs[i].Proto == proto && evs[i].Dst.String() == dst && evs[i].Port == port {
			return &evs[i]
		}
	}
	return nil
}

func findEventHost(evs []flightrec.Event, host string) *flightrec.Event {
	for i := range evs {
		if evs[i].Host == host {
			return &evs[i]
		}
	}
	return nil
}

// TestStackLoopback drives the stack with a userspace guest, with local
// servers reached through a redirecting policy: no root, no namespaces.
func TestStackLoopback(t *testing.T) {
	t.Parallel()
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "host="+r.Host)
	}))
	t.Cleanup(web.Close)
	webAddr := netip.MustParseAddrPort(web.Listener.Addr().String())
	echo := udpEcho(t)

	dir := t.TempDir()
	rec, err := flightrec.Open(flightrec.Config{Path: filepath.Join(dir, "net.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	pub := netip.MustParseAddr("203.0.113.10")
	pol := &redirectPolicy{
		to: map[netip.AddrPort]netip.AddrPort{
			netip.AddrPortFrom(pub, 80): webAddr,
			netip.AddrPortFrom(pub, 7):  echo,
		},
		sniff: webAddr,
		base:  egress.PublicOnly{HostAddrs: []netip.Addr{netip.MustParseAddr("198.51.100.99")}},
	}
	s, err := Start(Config{
		Socket:         filepath.Join(dir, "net.sock"),
		Policy:         pol,
		Recorder:       rec,
		Resolver:       localDNS(t),
		ResolvConf:     filepath.Join(dir, "missing-resolv.conf"),
		UDPIdleTimeout: 300 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if _, err := Start(Config{Socket: s.Socket()}); !errors.Is(err, errdefs.ErrAlreadyExists) {
		t.Errorf("second Start on the same socket: %v; want ErrAlreadyExists", err)
	}
	g := newTestGuest(t, s)
	client := g.httpClient()

	t.Run("http", func(t *testing.T) {
		resp, err := client.Get("http://203.0.113.10/")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "host=203.0.113.10" {
			t.Errorf("body %q", body)
		}
	})

	t.Run("refused", func(t *testing.T) {
		// A loopback destination never gets past the link (no Linux guest
		// sends one to its gateway): dropped and recorded, no RST.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		if c, err := g.dial(ctx, "127.0.0.1:80"); err == nil {
			c.Close()
			t.Error("connected to 127.0.0.1 through the stack")
		}
		cancel()
		for _, dst := range []string{"169.254.169.254:80", "192.168.1.1:80", "10.0.2.1:22", "100.64.0.1:443", "198.51.100.99:22"} {
			g.mustRefuse(t, dst)
		}
	})

	t.Run("dns", func(t *testing.T) {
		for _, network := range []string{"udp", "tcp"} {
			m, err := g.query(network, "test.example", dns.TypeA)
			if err != nil {
				t.Fatalf("%s: %v", network, err)
			}
			if len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != "203.0.113.10" {
				t.Errorf("%s A test.example: %v", network, m)
			}
		}
		m, err := g.query("udp", "test.example", dns.TypeAAAA)
		if err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) != 0 {
			t.Errorf("AAAA: %v, %v; want an empty answer", m, err)
		}
		m, err = g.query("udp", "nope.example", dns.TypeA)
		if err != nil || m.Rcode != dns.RcodeNameError {
			t.Errorf("missing name: %v, %v; want NXDOMAIN", m, err)
		}
		m, err = g.query("tcp", "blocked.example", dns.TypeA)
		if err != nil || m.Rcode != dns.RcodeNameError {
			t.Errorf("name the policy refuses: %v, %v; want NXDOMAIN", m, err)
		}
		m, err = g.query("udp", "test.example", dns.TypeTXT)
		if err != nil || m.Rcode != dns.RcodeNotImplemented {
			t.Errorf("TXT without host nameservers: %v, %v; want NOTIMP", m, err)
		}
	})

	t.Run("udp", func(t *testing.T) {
		got, err := g.udpExchange("203.0.113.10:7", []byte("ping"), 5*time.Second)
		if err != nil || string(got) != "ping" {
			t.Errorf("echo: %q, %v", got, err)
		}
		if _, err := g.udpExchange("127.0.0.1:7", []byte("ping"), 300*time.Millisecond); err == nil {
			t.Error("UDP to loopback got an answer")
		}
		if _, err := g.udpExchange("239.1.2.3:7", []byte("ping"), 300*time.Millisecond); err == nil {
			t.Error("UDP to a multicast group got an answer")
		}
	})

	t.Run("sniff", func(t *testing.T) {
		fresh := g.httpClient()
		fresh.Transport.(*http.Transport).DisableKeepAlives = true
		for _, tt := range []struct{ host, want string }{{"good.example", "host=good.example"}, {"evil.example", ""}} {
			req, _ := http.NewRequest("GET", "http://203.0.113.10:8080/", nil)
			req.Host = tt.host
			resp, err := fresh.Do(req)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Host %s: %v; want a 403", tt.host, err)
				}
				body, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusForbidden || !strings.Contains(string(body), "(host_mismatch)") {
					t.Errorf("Host %s: %s %q; want 403 naming host_mismatch", tt.host, resp.Status, body)
				}
				continue
			}
			if err != nil {
				t.Fatalf("Host %s: %v", tt.host, err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if string(body) != tt.want {
				t.Errorf("Host %s: body %q; want %q", tt.host, body, tt.want)
			}
		}
	})

	// An idle keep-alive connection is open now; Close must end it.
	client.CloseIdleConnections()
	idle, err := g.dial(context.Background(), "203.0.113.10:80")
	if err != nil {
		t.Fatal(err)
	}
	defer idle.Close()
	time.Sleep(500 * time.Millisecond) // let the UDP flow go idle and be recorded
	sum := s.Summary()
	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return with a flow open")
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, err := os.Stat(s.Socket()); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind: %v", err)
	}
	rec.Close()

	evs := readLog(t, rec.Path())
	for _, tt := range []struct {
		proto, dst string
		port       uint16
		allowed    bool
		reason     string
	}{
		{"tcp", "127.0.0.1", 80, false, egress.ReasonLoopback},
		{"tcp", "169.254.169.254", 80, false, egress.ReasonLinkLocal},
		{"tcp", "192.168.1.1", 80, false, egress.ReasonPrivate},
		{"tcp", "100.64.0.1", 443, false, egress.ReasonCGNAT},
		{"tcp", "198.51.100.99", 22, false, egress.ReasonHost},
		{"tcp", "10.0.2.1", 22, false, egress.ReasonGatewayPort},
		{"udp", "127.0.0.1", 7, false, egress.ReasonLoopback},
		{"udp", "239.1.2.3", 7, false, egress.ReasonMulticast},
		{"udp", "203.0.113.10", 7, true, "redirected"},
		{"tcp", "203.0.113.10", 80, true, "redirected"},
		{"dns", "10.0.2.1", 53, true, egress.ReasonDNS},
	} {
		ev := findEvent(evs, tt.proto, tt.dst, tt.port)
		if ev == nil {
			t.Errorf("no %s event for %s:%d in %+v", tt.proto, tt.dst, tt.port, evs)
			continue
		}
		if ev.Allowed != tt.allowed || ev.Reason != tt.reason {
			t.Errorf("%s %s:%d: allowed=%v reason=%q; want %v %q", tt.proto, tt.dst, tt.port, ev.Allowed, ev.Reason, tt.allowed, tt.reason)
		}
	}
	var web80, sniffOK, sniffBad, udp7 *flightrec.Event
	for i := range evs {
		ev := &evs[i]
		switch {
		case ev.Proto == "tcp" && ev.Port == 80 && ev.Allowed && ev.BytesDown > 0 && web80 == nil:
			web80 = ev
		case ev.Port == 8080 && ev.Reason == "host_ok":
			sniffOK = ev
		case ev.Port == 8080 && ev.Reason == "host_mismatch":
			sniffBad = ev
		case ev.Proto == "udp" && ev.Port == 7 && ev.Allowed:
			udp7 = ev
		}
	}
	if web80 == nil || web80.BytesUp < 40 || web80.BytesDown < int64(len("host=203.0.113.10")) {
		t.Errorf("HTTP flow bytes not recorded: %+v", web80)
	}
	if sniffOK == nil || sniffOK.Host != "good.example" || sniffOK.BytesUp == 0 || sniffOK.BytesDown == 0 {
		t.Errorf("sniffed flow: %+v", sniffOK)
	}
	if sniffBad == nil || sniffBad.Allowed || sniffBad.Host != "evil.example" {
		t.Errorf("refused sniffed flow: %+v", sniffBad)
	}
	if udp7 == nil || udp7.BytesUp != 4 || udp7.BytesDown != 4 {
		t.Errorf("UDP flow: %+v", udp7)
	}
	var dnsRefusedNX bool
	for _, ev := range evs {
		if ev.Proto == "dns" && ev.Host == "nope.example" && ev.Rcode == "NXDOMAIN" {
			dnsRefusedNX = true
		}
	}
	if !dnsRefusedNX {
		t.Error("NXDOMAIN query not recorded")
	}
	if ev := findEventHost(evs, "blocked.example"); ev == nil || ev.Allowed || ev.Reason != "name_not_allowed" || ev.Rcode != "NXDOMAIN" {
		t.Errorf("refused DNS query: %+v", ev)
	}
	tot := rec.Totals()
	if sum.Flows == 0 || sum.Denied == 0 || sum.BytesDown == 0 || sum.FramesIn == 0 || sum.FramesOut == 0 {
		t.Errorf("summary %+v", sum)
	}
	if tot.Flows < sum.Flows || tot.Denied < sum.Denied {
		t.Errorf("log totals %+v below the stack's summary %+v", tot, sum)
	}
}
