package netstack

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// DNS service limits.
const (
	dnsTimeout      = 5 * time.Second  // one query, end to end
	dnsTCPIdle      = 10 * time.Second // a TCP DNS connection between queries
	dnsMaxInFlight  = 64               // UDP queries being answered at once
	dnsMaxTCPConns  = 16
	dnsTTL          = 30 // seconds, for answers from the host resolver
	dnsMinUDPReply  = 512
	dnsMaxAnswerStr = 64
)

// startDNS serves DNS on gateway:53 over UDP and TCP inside the stack.
func (s *Stack) startDNS() error {
	addr := s.gatewayAddr(53)
	uc, err := gonet.DialUDP(s.ns, &addr, nil, ipv4.ProtocolNumber)
	if err != nil {
		return err
	}
	tl, err := gonet.ListenTCP(s.ns, addr, ipv4.ProtocolNumber)
	if err != nil {
		uc.Close()
		return err
	}
	s.mu.Lock()
	s.closers = append(s.closers, func() { uc.Close() }, func() { tl.Close() })
	s.mu.Unlock()
	s.wg.Add(2)
	go s.serveDNSUDP(uc)
	go s.serveDNSTCP(tl)
	return nil
}

func (s *Stack) serveDNSUDP(uc *gonet.UDPConn) {
	defer s.wg.Done()
	sem := make(chan struct{}, dnsMaxInFlight)
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := uc.ReadFrom(buf)
		if err != nil {
			return
		}
		src := from.(*net.UDPAddr).AddrPort()
		select {
		case sem <- struct{}{}:
		default:
			continue // overloaded: the guest's resolver retries
		}
		q := append([]byte(nil), buf[:n]...)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			if reply := s.answerDNS(src, q, true); reply != nil {
				uc.WriteTo(reply, from)
			}
		}()
	}
}

func (s *Stack) serveDNSTCP(l net.Listener) {
	defer s.wg.Done()
	sem := make(chan struct{}, dnsMaxTCPConns)
	var conns sync.Map
	defer conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		select {
		case sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		conns.Store(c, nil)
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() { <-sem }()
			defer conns.Delete(c)
			defer c.Close()
			src := c.RemoteAddr().(*net.TCPAddr).AddrPort()
			var lenBuf [2]byte
			for s.ctx.Err() == nil {
				c.SetDeadline(time.Now().Add(dnsTCPIdle))
				if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
					return
				}
				q := make([]byte, binary.BigEndian.Uint16(lenBuf[:]))
				if _, err := io.ReadFull(c, q); err != nil {
					return
				}
				reply := s.answerDNS(src, q, false)
				if reply == nil {
					return
				}
				out := binary.BigEndian.AppendUint16(make([]byte, 0, 2+len(reply)), uint16(len(reply)))
				if _, err := c.Write(append(out, reply...)); err != nil {
					return
				}
			}
		}()
	}
}

// answerDNS judges and answers one message; nil means no reply at all.
// Every message is one record: a query the policy judges, or one that is
// not a single standard query (malformed: FORMERR when its header can be
// read, NOTIMP for another opcode, no reply to a response).
func (s *Stack) answerDNS(src netip.AddrPort, wire []byte, udp bool) []byte {
	ev := flightrec.Event{Time: time.Now(), Proto: egress.ProtoDNS, Dst: s.cfg.Gateway, Port: 53, BytesUp: int64(len(wire))}
	s.bytesUp.Add(int64(len(wire)))
	q := new(dns.Msg)
	var out []byte
	if err := q.Unpack(wire); err != nil {
		ev.Host, ev.Reason, ev.Error = egress.MalformedHost, egress.ReasonMalformed, "unreadable DNS message"
		if out = formErr(wire); out != nil {
			ev.Rcode = dns.RcodeToString[dns.RcodeFormatError]
		}
	} else if reply := s.judgeDNS(src, q, &ev); reply != nil {
		out = s.packDNS(q, reply, udp)
		ev.Rcode = dns.RcodeToString[reply.Rcode]
		ev.Answers = answerStrings(reply.Answer)
	}
	ev.BytesDown = int64(len(out))
	s.bytesDn.Add(int64(len(out)))
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	s.emit(ev)
	return out
}

// judgeDNS decides a parsed message and returns the reply (nil: none),
// filling ev.
func (s *Stack) judgeDNS(src netip.AddrPort, q *dns.Msg, ev *flightrec.Event) *dns.Msg {
	ev.Host = egress.MalformedHost
	if len(q.Question) == 1 {
		ev.Host = dnsRecordHost(q.Question[0].Name)
	}
	switch {
	case q.Response:
		ev.Reason = egress.ReasonMalformed
		return nil // never answer an answer
	case q.Opcode != dns.OpcodeQuery:
		ev.Reason = egress.ReasonMalformed
		return new(dns.Msg).SetRcode(q, dns.RcodeNotImplemented)
	case len(q.Question) != 1:
		ev.Reason = egress.ReasonMalformed
		return new(dns.Msg).SetRcode(q, dns.RcodeFormatError)
	}
	qq := q.Question[0]
	ev.QType = dns.Type(qq.Qtype).String()
	v := s.policy.Decide(egress.Flow{Proto: egress.ProtoDNS, Src: src, Dst: netip.AddrPortFrom(s.cfg.Gateway, 53),
		Host: strings.TrimSuffix(strings.ToLower(qq.Name), "."), QType: ev.QType, QClass: dns.Class(qq.Qclass).String()})
	ev.Allowed, ev.Reason = v.Allow, v.Reason
	if !v.Allow {
		return new(dns.Msg).SetRcode(q, dns.RcodeNameError)
	}
	ctx, cancel := context.WithTimeout(s.ctx, dnsTimeout)
	defer cancel()
	if reply := s.dns.ServeDNS(ctx, src, q); reply != nil {
		return reply
	}
	return new(dns.Msg).SetRcode(q, dns.RcodeServerFailure)
}

// dnsRecordHost is how a queried name appears in the record: see
// egress.RecordHost; the root, which has no name, as a one-byte invalid one.
func dnsRecordHost(name string) string {
	h := egress.RecordHost(strings.TrimSuffix(strings.ToLower(name), "."))
	if h == "" {
		h = egress.InvalidHost(len(name))
	}
	return h
}

// packDNS packs reply to q, truncated to what the guest can take over UDP.
func (s *Stack) packDNS(q, reply *dns.Msg, udp bool) []byte {
	reply.Id = q.Id
	if udp {
		size := dnsMinUDPReply
		if o := q.IsEdns0(); o != nil && int(o.UDPSize()) > size {
			size = int(o.UDPSize())
		}
		reply.Truncate(size)
	}
	out, err := reply.Pack()
	if err != nil {
		out, _ = new(dns.Msg).SetRcode(q, dns.RcodeServerFailure).Pack()
	}
	return out
}

// formErr is the FORMERR reply to a message that does not parse: its
// header's ID, opcode and RD bit, no sections. Nil when there is no full
// header to answer, or the message is itself a response.
func formErr(wire []byte) []byte {
	if len(wire) < 12 || wire[2]&0x80 != 0 {
		return nil
	}
	out := make([]byte, 12)
	out[0], out[1] = wire[0], wire[1]
	out[2] = 0x80 | wire[2]&0x79 // QR, the opcode, RD
	out[3] = dns.RcodeFormatError
	return out
}

// answerStrings renders answers for the record: the address for A/AAAA,
// the record data otherwise.
func answerStrings(rrs []dns.RR) []string {
	var out []string
	for _, rr := range rrs {
		var v string
		switch rr := rr.(type) {
		case *dns.A:
			v = rr.A.String()
		case *dns.AAAA:
			v = rr.AAAA.String()
		default:
			v = strings.TrimSpace(strings.TrimPrefix(rr.String(), rr.Header().String()))
		}
		if len(v) > dnsMaxAnswerStr {
			v = v[:dnsMaxAnswerStr]
		}
		out = append(out, v)
		if len(out) == flightrec.MaxAnswers {
			break
		}
	}
	return out
}

// resolverDNS is the default DNSHandler: A (and AAAA) through the host's
// resolver, so /etc/hosts, search rules and the host's DNS setup all apply;
// every other type is relayed verbatim to the nameservers in the host's
// resolver configuration.
type resolverDNS struct {
	res        *net.Resolver
	resolvConf string
	ipv6       bool
	log        *slog.Logger

	once    sync.Once
	servers []string
}

func newResolverDNS(res *net.Resolver, resolvConf string, ipv6 bool, log *slog.Logger) *resolverDNS {
	return &resolverDNS{res: res, resolvConf: resolvConf, ipv6: ipv6, log: log}
}

func (r *resolverDNS) ServeDNS(ctx context.Context, _ netip.AddrPort, q *dns.Msg) *dns.Msg {
	qq := q.Question[0]
	name := strings.TrimSuffix(qq.Name, ".")
	reply := new(dns.Msg).SetReply(q)
	reply.RecursionAvailable = true
	switch {
	case qq.Qclass != dns.ClassINET:
		return reply.SetRcode(q, dns.RcodeNotImplemented)
	case qq.Qtype == dns.TypeA, qq.Qtype == dns.TypeAAAA:
		if qq.Qtype == dns.TypeAAAA && !r.ipv6 {
			return reply // no IPv6 in the guest: an empty answer
		}
		network := "ip4"
		if qq.Qtype == dns.TypeAAAA {
			network = "ip6"
		}
		addrs, err := r.res.LookupNetIP(ctx, network, name)
		if err != nil {
			var de *net.DNSError
			if errors.As(err, &de) && de.IsNotFound {
				return reply.SetRcode(q, dns.RcodeNameError)
			}
			r.log.Debug("dns lookup failed", "name", name, "err", err)
			return nil
		}
		return answer(reply, qq, addrs)
	}
	return r.relay(ctx, q)
}

// relay sends q to the host's nameservers in turn, retrying over TCP when a
// UDP answer comes back truncated. NOTIMP when there are none.
func (r *resolverDNS) relay(ctx context.Context, q *dns.Msg) *dns.Msg {
	r.once.Do(func() {
		cc, err := dns.ClientConfigFromFile(r.resolvConf)
		if err != nil {
			r.log.Warn("dns: no host nameservers for relayed queries", "err", err)
			return
		}
		for _, s := range cc.Servers {
			r.servers = append(r.servers, net.JoinHostPort(s, cc.Port))
		}
	})
	if len(r.servers) == 0 {
		return new(dns.Msg).SetRcode(q, dns.RcodeNotImplemented)
	}
	for _, server := range r.servers {
		for _, network := range []string{"udp", "tcp"} {
			c := &dns.Client{Net: network, Timeout: dnsTimeout}
			in, _, err := c.ExchangeContext(ctx, q, server)
			if err != nil {
				break // next server
			}
			if in.Truncated && network == "udp" {
				continue
			}
			return in
		}
		if ctx.Err() != nil {
			break
		}
	}
	return nil
}

// AddrResolver answers the A and AAAA queries a Policy allowed with
// addresses, as egress.Filter does: egress.ErrNoSuchHost for a name that
// does not exist, egress.ErrNotAllowed for a query it does not answer.
type AddrResolver interface {
	ResolveDNS(ctx context.Context, name, qtype string) ([]netip.Addr, error)
}

// ResolverHandler is a DNSHandler that builds its replies from r's
// addresses: NXDOMAIN for egress.ErrNoSuchHost, REFUSED for
// egress.ErrNotAllowed, SERVFAIL for any other error.
func ResolverHandler(r AddrResolver) DNSHandler { return addrHandler{r} }

type addrHandler struct{ r AddrResolver }

func (h addrHandler) ServeDNS(ctx context.Context, _ netip.AddrPort, q *dns.Msg) *dns.Msg {
	reply := new(dns.Msg).SetReply(q)
	reply.RecursionAvailable = true
	qq := q.Question[0]
	addrs, err := h.r.ResolveDNS(ctx, qq.Name, dns.Type(qq.Qtype).String())
	switch {
	case errors.Is(err, egress.ErrNoSuchHost):
		return reply.SetRcode(q, dns.RcodeNameError)
	case errors.Is(err, egress.ErrNotAllowed):
		return reply.SetRcode(q, dns.RcodeRefused)
	case err != nil:
		return nil
	}
	return answer(reply, qq, addrs)
}

// answer adds to reply the records of addrs that match question qq's type
// (A for IPv4, AAAA for IPv6).
func answer(reply *dns.Msg, qq dns.Question, addrs []netip.Addr) *dns.Msg {
	hdr := dns.RR_Header{Name: qq.Name, Rrtype: qq.Qtype, Class: dns.ClassINET, Ttl: dnsTTL}
	for _, a := range addrs {
		a = a.Unmap()
		switch {
		case qq.Qtype == dns.TypeA && a.Is4():
			reply.Answer = append(reply.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
		case qq.Qtype == dns.TypeAAAA && a.Is6():
			reply.Answer = append(reply.Answer, &dns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return reply
}
