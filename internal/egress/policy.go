package egress

import (
	"net/netip"
	"slices"
)

// Flow kinds, used in [Flow.Proto] and [Event.Proto].
const (
	ProtoTCP  = "tcp"
	ProtoUDP  = "udp"
	ProtoDNS  = "dns"
	ProtoICMP = "icmp"
)

// Reasons. A verdict or event carries one; allowed flows carry ReasonPublic
// or ReasonLANAllowed so that the record shows why they went out.
const (
	ReasonPublic      = "public"
	ReasonLANAllowed  = "lan_allowed" // private or CGNAT, allowed by AllowLAN
	ReasonPrivate     = "private_destination"
	ReasonCGNAT       = "cgnat_destination"
	ReasonLoopback    = "loopback"
	ReasonLinkLocal   = "link_local"
	ReasonMulticast   = "multicast"
	ReasonUnspecified = "unspecified"
	ReasonBroadcast   = "broadcast"
	ReasonReserved    = "reserved"
	ReasonHost        = "host_address"
	ReasonInvalid     = "invalid_destination"
	ReasonDNS         = "dns" // a DNS query, answered at the gateway

	// Reasons a network path adds on its own, outside any Policy.
	ReasonGatewayPort  = "gateway_port"  // a port the gateway does not serve
	ReasonFlowLimit    = "flow_limit"    // too many concurrent flows
	ReasonNotForwarded = "not_forwarded" // a protocol the path never forwards (ICMP beyond the gateway)
	ReasonDialFailed   = "dial_failed"   // allowed, but the host could not connect
	ReasonShuttingDown = "shutting_down" // the network is being torn down
)

// Flow describes one new connection, UDP flow or DNS query as the guest
// asked for it.
type Flow struct {
	Proto string         // ProtoTCP, ProtoUDP or ProtoDNS
	Src   netip.AddrPort // the guest's end
	Dst   netip.AddrPort // where the guest sent it (the gateway, for DNS)
	// Host is a name, when one is known: the queried name for ProtoDNS
	// (lower case, no trailing dot), the HTTP Host or TLS SNI once a
	// Sniffer has read it.
	Host  string
	QType string // ProtoDNS: the query type ("A", "AAAA", "TXT", ...)
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
	// stack and pass its first bytes to the policy's [Sniffer] before
	// anything is dialled. Ignored when the policy is not a Sniffer.
	Sniff bool
}

// Policy is the single decision point for a guest's egress. Decide is called
// once per new TCP connection, UDP flow and DNS query, from many goroutines
// at once, on the packet path: it must be fast and must not block.
type Policy interface {
	Decide(f Flow) Verdict
}

// Sniffer is a Policy that can judge a TCP connection by its first bytes (an
// HTTP Host header, a TLS ClientHello's SNI). The network path calls Sniff
// with everything read so far after a Decide verdict with Sniff set; more
// asks for more bytes, and is ignored once the path's read cap or deadline
// is reached (the last verdict then stands).
type Sniffer interface {
	Policy
	Sniff(f Flow, head []byte) (v Verdict, more bool)
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
