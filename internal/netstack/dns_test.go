package netstack

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"isopod/internal/egress"
)

// dnsHeader is a query header: ID 0x1234, the given flags, counts.
func dnsHeader(flags uint16, qd, an uint16) []byte {
	b := make([]byte, 12)
	binary.BigEndian.PutUint16(b[0:], 0x1234)
	binary.BigEndian.PutUint16(b[2:], flags)
	binary.BigEndian.PutUint16(b[4:], qd)
	binary.BigEndian.PutUint16(b[6:], an)
	return b
}

func packed(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	m.Id = 0x1234
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestDNSMalformed: every message that is not one standard query is one
// record, reason malformed, never named after the gateway; FORMERR answers
// a message whose header can be read.
func TestDNSMalformed(t *testing.T) {
	noServer := netip.MustParseAddrPort("127.0.0.1:9") // no TCP is dialled here
	g, rec := filteredStack(t, noServer, noServer)
	longName := strings.Repeat(strings.Repeat("a", 63)+".", 4) + "example" // 263 bytes
	long := append(dnsHeader(0x0100, 1, 0), func() []byte {
		var b []byte
		for _, l := range strings.Split(longName, ".") {
			b = append(b, byte(len(l)))
			b = append(b, l...)
		}
		return append(b, 0, 0, 1, 0, 1)
	}()...)
	two := new(dns.Msg)
	two.Id = 0x1234
	two.Question = []dns.Question{{Name: "ok.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}, {Name: "b.example.", Qtype: dns.TypeA, Qclass: dns.ClassINET}}
	notify := new(dns.Msg).SetQuestion("ok.example.", dns.TypeSOA)
	notify.Opcode = dns.OpcodeNotify
	answer := new(dns.Msg).SetQuestion("ok.example.", dns.TypeA)
	answer.Response = true
	chaos := new(dns.Msg).SetQuestion("ok.example.", dns.TypeA)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	tests := []struct {
		name  string
		wire  []byte
		rcode int // -1: no reply
		host  string
		rsn   string
	}{
		{"compression loop", append(dnsHeader(0x0100, 1, 0), 0xc0, 12, 0, 1, 0, 1), dns.RcodeFormatError, egress.MalformedHost, egress.ReasonMalformed},
		{"name over 255 bytes", long, dns.RcodeFormatError, egress.MalformedHost, egress.ReasonMalformed},
		{"truncated header", []byte{0x12, 0x34, 1, 0, 0}, -1, egress.MalformedHost, egress.ReasonMalformed},
		{"two questions", packed(t, two), dns.RcodeFormatError, egress.MalformedHost, egress.ReasonMalformed},
		{"notify", packed(t, notify), dns.RcodeNotImplemented, "ok.example", egress.ReasonMalformed},
		{"a response", packed(t, answer), -1, "ok.example", egress.ReasonMalformed},
		{"class chaos", packed(t, chaos), dns.RcodeNameError, "ok.example", egress.ReasonDNSType},
		{"the root", packed(t, new(dns.Msg).SetQuestion(".", dns.TypeA)), dns.RcodeNameError, "<invalid:1>", egress.ReasonInvalidName},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, network := range []string{"udp", "tcp"} {
				rec.Reset()
				// A reply is awaited long enough for a loaded host; where
				// none is due, the record is what the test waits for.
				wait := 10 * time.Second
				if tt.rcode < 0 {
					wait = 300 * time.Millisecond
				}
				reply, err := g.rawDNS(network, tt.wire, wait)
				switch {
				case tt.rcode < 0 && err == nil && len(reply) > 0:
					t.Errorf("%s: reply % x; want none", network, reply)
				case tt.rcode >= 0 && (err != nil || len(reply) < 12):
					t.Errorf("%s: %v, reply % x; want rcode %d", network, err, reply, tt.rcode)
				case tt.rcode >= 0:
					if id, rc := binary.BigEndian.Uint16(reply), int(reply[3]&0x0f); id != 0x1234 || rc != tt.rcode || reply[2]&0x80 == 0 {
						t.Errorf("%s: reply id %#x rcode %d; want 0x1234, %d, a response", network, id, rc, tt.rcode)
					}
				}
				evs := rec.Wait(1)
				if len(evs) != 1 {
					t.Fatalf("%s: %d records; want 1: %+v", network, len(evs), evs)
				}
				if ev := evs[0]; ev.Proto != egress.ProtoDNS || ev.Allowed || ev.Reason != tt.rsn || ev.Host != tt.host {
					t.Errorf("%s: record %+v; want refused %s host %q", network, ev, tt.rsn, tt.host)
				}
			}
		})
	}
}

// rawDNS sends one message to the gateway's resolver and returns the reply
// (over TCP, without its length), waiting at most wait for it.
func (g *testGuest) rawDNS(network string, wire []byte, wait time.Duration) ([]byte, error) {
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
		return nil, err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(wait))
	msg := wire
	if network == "tcp" {
		msg = binary.BigEndian.AppendUint16(nil, uint16(len(wire)))
		msg = append(msg, wire...)
	}
	if _, err := c.Write(msg); err != nil {
		return nil, err
	}
	buf := make([]byte, 1024)
	n, err := c.Read(buf)
	if network == "tcp" && n >= 2 {
		return buf[2:n], err
	}
	return buf[:n], err
}
