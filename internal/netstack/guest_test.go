package netstack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
)

// testGuest stands in for a QEMU guest: a second userspace stack whose NIC
// speaks the same length-prefixed ethernet framing over the Stack's socket.
type testGuest struct {
	ns *stack.Stack
	gw netip.Addr
}

func newTestGuest(t testing.TB, s *Stack) *testGuest {
	t.Helper()
	c, err := net.Dial("unix", s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	ns := stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol},
	})
	if err := tuneTCP(ns); err != nil {
		t.Fatal(err)
	}
	l := newLink(uint32(s.cfg.MTU), tcpip.LinkAddress(s.cfg.GuestMAC), nil)
	if err := ns.CreateNIC(1, l); err != nil {
		t.Fatal(err)
	}
	addr := tcpip.AddressWithPrefix{Address: tcpip.AddrFrom4(s.GuestIP().As4()), PrefixLen: s.cfg.GuestAddr.Bits()}
	if err := ns.AddProtocolAddress(1, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: addr}, stack.AddressProperties{}); err != nil {
		t.Fatal(err)
	}
	ns.SetRouteTable([]tcpip.Route{
		{Destination: addr.Subnet(), NIC: 1},
		{Destination: header.IPv4EmptySubnet, Gateway: tcpip.AddrFrom4(s.cfg.Gateway.As4()), NIC: 1},
	})
	done := make(chan struct{})
	go func() {
		defer close(done)
		l.serve(c)
	}()
	t.Cleanup(func() {
		c.Close()
		<-done
		ns.Close()
		ns.Wait()
	})
	return &testGuest{ns: ns, gw: s.cfg.Gateway}
}

func fullAddr(ap netip.AddrPort) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: 1, Addr: tcpip.AddrFrom4(ap.Addr().As4()), Port: ap.Port()}
}

// dial opens a TCP connection from the guest.
func (g *testGuest) dial(ctx context.Context, dst string) (net.Conn, error) {
	ap, err := netip.ParseAddrPort(dst)
	if err != nil {
		return nil, err
	}
	return gonet.DialContextTCP(ctx, g.ns, fullAddr(ap), ipv4.ProtocolNumber)
}

// httpClient makes requests from the guest (IP literal URLs only).
func (g *testGuest) httpClient() *http.Client {
	return &http.Client{
		Timeout: 2 * time.Minute,
		Transport: &http.Transport{
			DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return g.dial(ctx, addr) },
		},
	}
}

// query asks the gateway's DNS over UDP or TCP.
func (g *testGuest) query(network, name string, qtype uint16) (*dns.Msg, error) {
	gw := fullAddr(netip.AddrPortFrom(g.gw, 53))
	var c net.Conn
	var err error
	if network == "udp" {
		c, err = gonet.DialUDP(g.ns, nil, &gw, ipv4.ProtocolNumber)
	} else {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		c, err = gonet.DialContextTCP(ctx, g.ns, gw, ipv4.ProtocolNumber)
	}
	if err != nil {
		return nil, fmt.Errorf("dialling gateway DNS: %w", err)
	}
	dc := &dns.Conn{Conn: c}
	defer dc.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	q := new(dns.Msg).SetQuestion(dns.Fqdn(name), qtype)
	if err := dc.WriteMsg(q); err != nil {
		return nil, err
	}
	return dc.ReadMsg()
}

// udpExchange sends one datagram from the guest to dst and waits for one
// reply.
func (g *testGuest) udpExchange(dst string, msg []byte, wait time.Duration) ([]byte, error) {
	ap, err := netip.ParseAddrPort(dst)
	if err != nil {
		return nil, err
	}
	fa := fullAddr(ap)
	c, err := gonet.DialUDP(g.ns, nil, &fa, ipv4.ProtocolNumber)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	return buf[:n], err
}

// mustRefuse dials dst through the stack and fails unless the connection is
// refused (a RST) within a second.
func (g *testGuest) mustRefuse(t testing.TB, dst string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	start := time.Now()
	c, err := g.dial(ctx, dst)
	if err == nil {
		c.Close()
		t.Errorf("%s: connected through the stack; want refused", dst)
		return
	}
	if d := time.Since(start); d > time.Second || !strings.Contains(err.Error(), "refused") {
		t.Errorf("%s: %v after %v; want a RST at once", dst, err, d)
	}
}
