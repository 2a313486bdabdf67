package egress

import (
	"net/netip"
	"testing"
)

func TestCategory(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"8.8.8.8", CatPublic},
		{"1.1.1.1", CatPublic},
		{"203.0.113.10", CatPublic}, // documentation ranges are public on purpose
		{"198.51.100.10", CatPublic},
		{"192.0.2.1", CatPublic},
		{"10.0.0.1", CatPrivate},
		{"10.255.255.255", CatPrivate},
		{"172.16.0.1", CatPrivate},
		{"172.31.255.254", CatPrivate},
		{"172.32.0.1", CatPublic},
		{"192.168.77.10", CatPrivate},
		{"100.64.0.1", CatCGNAT},
		{"100.127.255.254", CatCGNAT},
		{"100.128.0.1", CatPublic},
		{"127.0.0.1", CatLoopback},
		{"127.8.9.10", CatLoopback},
		{"169.254.169.254", CatLinkLocal},
		{"169.254.0.1", CatLinkLocal},
		{"224.0.0.251", CatMulticast},
		{"239.255.255.250", CatMulticast},
		{"0.0.0.0", CatUnspecified},
		{"0.1.2.3", CatUnspecified},
		{"255.255.255.255", CatBroadcast},
		{"240.0.0.1", CatReserved},
		{"::ffff:10.1.2.3", CatPrivate}, // v4-mapped judged as v4
		{"::ffff:127.0.0.1", CatLoopback},
		{"::ffff:169.254.169.254", CatLinkLocal},
		{"::ffff:8.8.8.8", CatPublic},
		{"64:ff9b::a9fe:a9fe", CatLinkLocal}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", CatPublic},
		{"2606:4700::1111", CatPublic},
		{"2001:db8::1", CatPublic},
		{"fd00::1", CatPrivate},
		{"fc00::1", CatPrivate},
		{"fec0::1", CatPrivate},
		{"fe80::1", CatLinkLocal},
		{"::1", CatLoopback},
		{"::", CatUnspecified},
		{"ff02::1", CatMulticast},
		{"100::1", CatReserved},
	}
	for _, tt := range tests {
		if got := Category(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Category(%s) = %q; want %q", tt.addr, got, tt.want)
		}
	}
	if got := Category(netip.Addr{}); got != CatInvalid {
		t.Errorf("Category(zero) = %q; want %q", got, CatInvalid)
	}
}

func TestPublicOnly(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("10.9.9.9")}
	tests := []struct {
		dst      string
		allowLAN bool
		allow    bool
		reason   string
	}{
		{"203.0.113.10", false, true, ReasonPublic},
		{"192.168.77.10", false, false, ReasonPrivate},
		{"192.168.77.10", true, true, ReasonLANAllowed},
		{"100.64.1.1", false, false, ReasonCGNAT},
		{"100.64.1.1", true, true, ReasonLANAllowed},
		{"fd12::1", false, false, ReasonPrivate},
		{"fd12::1", true, true, ReasonLANAllowed},
		// Always refused, AllowLAN or not.
		{"169.254.169.254", true, false, ReasonLinkLocal},
		{"127.0.0.1", true, false, ReasonLoopback},
		{"::1", true, false, ReasonLoopback},
		{"fe80::1", true, false, ReasonLinkLocal},
		{"224.0.0.251", true, false, ReasonMulticast},
		{"0.0.0.0", true, false, ReasonUnspecified},
		{"255.255.255.255", true, false, ReasonBroadcast},
		{"240.1.1.1", true, false, ReasonReserved},
		{"192.0.2.2", true, false, ReasonHost},        // public range, but the host's own
		{"::ffff:192.0.2.2", true, false, ReasonHost}, // mapped form too
		{"10.9.9.9", true, false, ReasonHost},         // host beats AllowLAN
	}
	for _, tt := range tests {
		p := &PublicOnly{AllowLAN: tt.allowLAN, HostAddrs: host}
		for _, proto := range []string{ProtoTCP, ProtoUDP} {
			f := Flow{Proto: proto, Dst: netip.AddrPortFrom(netip.MustParseAddr(tt.dst), 443)}
			v := p.Decide(f)
			if v.Allow != tt.allow || v.Reason != tt.reason {
				t.Errorf("%s %s lan=%v: got allow=%v reason=%q; want allow=%v reason=%q",
					proto, tt.dst, tt.allowLAN, v.Allow, v.Reason, tt.allow, tt.reason)
			}
			if v.Dial.IsValid() || v.Sniff {
				t.Errorf("%s %s: PublicOnly set Dial %v / Sniff %v", proto, tt.dst, v.Dial, v.Sniff)
			}
		}
	}
	v := (&PublicOnly{}).Decide(Flow{Proto: ProtoDNS, Host: "example.com", QType: "A"})
	if !v.Allow || v.Reason != ReasonDNS {
		t.Errorf("DNS query: got %+v; want allowed", v)
	}
}
