package netstack

import (
	"net/netip"

	"gvisor.dev/gvisor/pkg/tcpip/header"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// icmpv6NeighborSolicit is the ICMPv6 type of a neighbour solicitation.
const icmpv6NeighborSolicit = 135

// noteIPv6 records a guest's attempt to reach an IPv6 destination. The
// stack offers no IPv6, so every such frame is dropped; only attempts at
// real destinations are recorded (not the multicast and link-local
// chatter of an IPv6-enabled kernel). A guest that configured a global
// address itself first asks for its destination's link address, so a
// neighbour solicitation for a global target counts as an attempt at that
// target.
func (s *Stack) noteIPv6(pkt []byte) {
	ip := header.IPv6(pkt)
	if !ip.IsValid(len(pkt)) {
		return
	}
	dst := netip.AddrFrom16(ip.DestinationAddress().As16())
	payload := ip.Payload()
	var proto string
	var port uint16
	switch ip.TransportProtocol() {
	case header.TCPProtocolNumber, header.UDPProtocolNumber:
		proto = egress.ProtoTCP
		if ip.TransportProtocol() == header.UDPProtocolNumber {
			proto = egress.ProtoUDP
		}
		if len(payload) >= 4 {
			port = uint16(payload[2])<<8 | uint16(payload[3])
		}
	case header.ICMPv6ProtocolNumber:
		proto = egress.ProtoICMP
		if len(payload) >= 24 && payload[0] == icmpv6NeighborSolicit {
			dst = netip.AddrFrom16([16]byte(payload[8:24]))
		}
	default:
		return
	}
	if !dst.IsGlobalUnicast() || dst.IsLinkLocalUnicast() {
		return
	}
	if s.quiet.first(proto, dst, port) {
		s.refuse(flightrec.Event{Proto: proto, Dst: dst, Port: port, Reason: egress.ReasonIPv6})
	}
}
