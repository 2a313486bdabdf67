package egress

import "net/netip"

// Address categories returned by [Category].
const (
	CatPublic      = "public"
	CatPrivate     = "private"     // RFC 1918, IPv6 ULA fc00::/7 (and deprecated site-local)
	CatCGNAT       = "cgnat"       // 100.64.0.0/10
	CatLoopback    = "loopback"    // 127.0.0.0/8, ::1
	CatLinkLocal   = "link_local"  // 169.254.0.0/16 (cloud metadata too), fe80::/10
	CatMulticast   = "multicast"   // 224.0.0.0/4, ff00::/8
	CatUnspecified = "unspecified" // 0.0.0.0/8, ::
	CatBroadcast   = "broadcast"   // 255.255.255.255
	CatReserved    = "reserved"    // 240.0.0.0/4 and other never-routable space
	CatHost        = "host"        // one of the host's own addresses (see PublicOnly)
	CatInvalid     = "invalid"     // the zero netip.Addr
)

var (
	v4CGNAT    = netip.MustParsePrefix("100.64.0.0/10")
	v4ThisNet  = netip.MustParsePrefix("0.0.0.0/8")
	v4Reserved = netip.MustParsePrefix("240.0.0.0/4")
	v4Bcast    = netip.MustParseAddr("255.255.255.255")
	v6SiteLoc  = netip.MustParsePrefix("fec0::/10")
	v6NAT64    = netip.MustParsePrefix("64:ff9b::/96")
	v6Discard  = netip.MustParsePrefix("100::/64")
)

// Category classifies addr by its intrinsic range. It does not know the
// host's own addresses; [PublicOnly] checks those first.
//
// IPv4-mapped IPv6 addresses (::ffff:a.b.c.d) and well-known NAT64
// addresses (64:ff9b::a.b.c.d) are judged by the IPv4 address they carry.
// Documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24,
// 2001:db8::/32) count as public on purpose: isopod's network tests use them
// as stand-ins for the internet.
func Category(addr netip.Addr) string {
	if !addr.IsValid() {
		return CatInvalid
	}
	addr = addr.Unmap()
	if addr.Is6() && v6NAT64.Contains(addr) {
		b := addr.As16()
		addr = netip.AddrFrom4([4]byte{b[12], b[13], b[14], b[15]})
	}
	// Each family-specific prefix never contains an address of the other
	// family, so one ordered switch serves both.
	switch {
	case addr == v4Bcast:
		return CatBroadcast
	case addr.IsUnspecified(), v4ThisNet.Contains(addr):
		return CatUnspecified
	case addr.IsLoopback():
		return CatLoopback
	case addr.IsLinkLocalUnicast():
		return CatLinkLocal
	case addr.IsMulticast():
		return CatMulticast
	case addr.IsPrivate(), v6SiteLoc.Contains(addr):
		return CatPrivate
	case v4CGNAT.Contains(addr):
		return CatCGNAT
	case v4Reserved.Contains(addr), v6Discard.Contains(addr):
		return CatReserved
	}
	return CatPublic
}
