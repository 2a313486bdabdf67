package egress

import (
	"net/netip"
	"slices"
)

// Flow kinds, used in [Flow.Proto] and in records.
const (
	ProtoTCP  = "tcp"
	ProtoUDP  = "udp"
	ProtoDNS  = "dns"
	ProtoICMP = "icmp"
	// Requests to the gateway's proxies, in records only.
	ProtoHTTPProxy = "http_proxy"
	ProtoSOCKS     = "socks5"
	// Requests to the gateway's credential endpoint, in records only.
	ProtoCredential = "credential"
)

// Where a name a [Sniffer] judges was found, in [Flow.HostFrom].
const (
	HostFromSNI  = "sni"  // a TLS ClientHello's server_name
	HostFromHTTP = "http" // an HTTP request's Host, target authority or :authority
)

// Flow describes one new connection, UDP flow or DNS query as the guest
// asked for it.
type Flow struct {
	Proto string         // ProtoTCP, ProtoUDP or ProtoDNS
	Src   netip.AddrPort // the guest's end
	Dst   netip.AddrPort // where the guest sent it (the gateway, for DNS)
	// Host is a name, when one is known: the queried name for ProtoDNS
	// (lower case, no trailing dot), or, for [Sniffer.Sniff], a name the
	// connection carries exactly as the guest sent it ("" when it carries
	// none).
	Host string
	// HostFrom says where Host was found, for Sniff: HostFromSNI or
	// HostFromHTTP.
	HostFrom string
	QType    string // ProtoDNS: the query type ("A", "AAAA", "TXT", ...)
	QClass   string // ProtoDNS: the query class ("IN", "CH", ...); "" means IN
}

// Verdict is a Policy's answer for one Flow.
type Verdict struct {
	Allow  bool
	Reason string
	// Dial is where the host connects for an allowed TCP or UDP flow; the
	// zero value means Flow.Dst.
	Dial netip.AddrPort
	// Host names the destination in the record, when the policy knows it
	// (for example from the DNS answers it handed out).
	Host string
	// Sniff asks the network path to accept a TCP connection in the guest's
	// stack and to have the policy's [Sniffer] judge the names it carries
	// before anything is dialled. Ignored when the policy is not a Sniffer.
	Sniff bool
}

// Policy is the single decision point for a guest's egress. Decide is called
// once per new TCP connection, UDP flow and DNS query, from many goroutines
// at once, on the packet path: it must be fast and must not block.
type Policy interface {
	Decide(f Flow) Verdict
}

// Sniffer is a Policy that also judges the names a TCP connection carries
// (a TLS server_name, the Host and target of each HTTP request). After a
// Decide verdict with Sniff set, the network path reads the connection's
// bytes, and for each name it finds calls Sniff with the Decide flow, Host
// set to the name and HostFrom to where it was found. Parsing the bytes is
// the network path's business; a Sniffer only judges names.
type Sniffer interface {
	Policy
	Sniff(f Flow) Verdict
}

// PublicOnly is isopod's default policy: the guest may reach the public
// internet and nothing else.
//
// Loopback, link-local (cloud metadata included), multicast, broadcast,
// unspecified, reserved and the host's own addresses are always refused.
// Private (RFC 1918, ULA) and CGNAT destinations are refused unless AllowLAN.
// DNS queries are allowed. The gateway itself is the network path's business
// and never reaches a Policy.
type PublicOnly struct {
	AllowLAN bool
	// HostAddrs are the host's own addresses, refused whatever their range
	// (a public address on a host interface reaches host services).
	HostAddrs []netip.Addr
}

// Decide implements Policy.
func (p *PublicOnly) Decide(f Flow) Verdict {
	if f.Proto == ProtoDNS {
		return Verdict{Allow: true, Reason: ReasonDNS}
	}
	dst := f.Dst.Addr().Unmap()
	if slices.ContainsFunc(p.HostAddrs, func(a netip.Addr) bool { return a.Unmap() == dst }) {
		return Verdict{Reason: ReasonHost}
	}
	switch c := Category(dst); c {
	case CatPublic:
		return Verdict{Allow: true, Reason: ReasonPublic}
	case CatPrivate, CatCGNAT:
		if p.AllowLAN {
			return Verdict{Allow: true, Reason: ReasonLANAllowed}
		}
		return Verdict{Reason: CategoryReason(c)}
	default:
		return Verdict{Reason: CategoryReason(c)}
	}
}

// CategoryReason is the refusal reason for a destination of category c.
func CategoryReason(c string) string {
	switch c {
	case CatPublic:
		return ReasonPublic
	case CatPrivate:
		return ReasonPrivate
	case CatCGNAT:
		return ReasonCGNAT
	case CatLoopback:
		return ReasonLoopback
	case CatLinkLocal:
		return ReasonLinkLocal
	case CatMulticast:
		return ReasonMulticast
	case CatUnspecified:
		return ReasonUnspecified
	case CatBroadcast:
		return ReasonBroadcast
	case CatReserved:
		return ReasonReserved
	case CatHost:
		return ReasonHost
	}
	return ReasonInvalid
}
