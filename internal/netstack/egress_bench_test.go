package netstack

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/egress"
)

// redirected sends every allowed connection to a local server, so a
// policy's cost can be measured without a routed network.
type redirected struct {
	inner egress.Policy
	to    netip.AddrPort
}

func (r *redirected) Decide(f egress.Flow) egress.Verdict {
	v := r.inner.Decide(f)
	if v.Allow {
		v.Dial = r.to
	}
	return v
}

func (r *redirected) Sniff(f egress.Flow) egress.Verdict {
	sn, ok := r.inner.(egress.Sniffer)
	if !ok {
		return egress.Verdict{}
	}
	v := sn.Sniff(f)
	if v.Allow {
		v.Dial = r.to
	}
	return v
}

// headServer answers each connection "ok" once it has read a request head,
// and closes after the client does.
func headServer(t testing.TB) netip.AddrPort {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				io.WriteString(c, "ok")
				io.Copy(io.Discard, br) // the client closes first
			}()
		}
	}()
	return netip.MustParseAddrPort(l.Addr().String())
}

// BenchmarkBrokerConnections measures short connections per second from a
// userspace guest through the stack: the NAT policy (PublicOnly), the
// filtered policy on a port it only checks by address (8080), and the
// filtered policy on port 80, where it also reads the HTTP Host. Run it
// with a fixed count (-benchtime=2000x). The guest closes first, as most
// clients do: when the server side closes first the stack's end of the
// connection sits in TIME_WAIT, and a guest reusing that port within a
// minute is not answered.
func BenchmarkBrokerConnections(b *testing.B) {
	srv := headServer(b)
	lookup := func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("203.0.113.10")}, nil
	}
	rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"allowed.example"}})
	if err != nil {
		b.Fatal(err)
	}
	filter, err := egress.NewFilter(egress.FilterConfig{Rules: rules, Lookup: lookup})
	if err != nil {
		b.Fatal(err)
	}
	filter.Pin("allowed.example", []netip.Addr{netip.MustParseAddr("203.0.113.10")})
	for _, bc := range []struct {
		name   string
		policy egress.Policy
		port   uint16
	}{
		{"nat", &egress.PublicOnly{}, 80},
		{"filtered_addr", filter, 8080},
		{"filtered_host", filter, 80},
	} {
		b.Run(bc.name, func(b *testing.B) {
			dir := b.TempDir()
			s, err := Start(Config{Socket: filepath.Join(dir, "n.sock"), Policy: &redirected{inner: bc.policy, to: srv},
				ResolvConf: filepath.Join(dir, "none")})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close() })
			g := newTestGuest(b, s)
			dst := netip.AddrPortFrom(netip.MustParseAddr("203.0.113.10"), bc.port).String()
			req := "GET / HTTP/1.1\r\nHost: allowed.example\r\n\r\n"
			start := time.Now()
			n := 0
			for b.Loop() {
				n++
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				c, err := g.dial(ctx, dst)
				cancel()
				if err != nil {
					b.Fatalf("connection %d: %v", n, err)
				}
				io.WriteString(c, req)
				got := make([]byte, 2)
				_, err = io.ReadFull(c, got)
				c.Close()
				if err != nil || string(got) != "ok" {
					b.Fatalf("answer %q", got)
				}
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "conns/s")
		})
	}
}
