package egress

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

func TestParsePattern(t *testing.T) {
	tests := []struct {
		in, want string // want "" means an error
	}{
		{"example.org", "example.org"},
		{"Example.ORG.", "example.org"},
		{"*.example.org", "*.example.org"},
		{"*.EXAMPLE.org.", "*.example.org"},
		{"bücher.example", "xn--bcher-kva.example"},
		{"*.bücher.example", "*.xn--bcher-kva.example"},
		{"_dmarc.example.org", "_dmarc.example.org"},
		{"*.org", ""},           // too broad
		{"*", ""},               // nothing but a wildcard
		{"a.*.example.org", ""}, // wildcard not first
		{"**.example.org", ""},
		{"*example.org", ""},
		{"example.org:443", ""},
		{"https://example.org", ""},
		{"203.0.113.10", ""}, // addresses go to --allow-cidr
		{"2001:db8::1", ""},
		{"", ""},
		{" example.org", ""},
		{"exa mple.org", ""},
		{"-bad.example", ""},
		{"a..example", ""},
		{strings.Repeat("a", 64) + ".example", ""},
		{strings.Repeat("abcdefghi.", 26) + "example", ""}, // over 253 bytes
	}
	for _, tt := range tests {
		p, err := parsePattern(tt.in)
		if tt.want == "" {
			if err == nil {
				t.Errorf("parsePattern(%q) = %v; want an error", tt.in, p)
			} else if !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("parsePattern(%q): %v is not ErrInvalidArgument", tt.in, err)
			}
			continue
		}
		if err != nil || p.String() != tt.want {
			t.Errorf("parsePattern(%q) = %v, %v; want %s", tt.in, p, err, tt.want)
		}
	}
}

func TestPatternMatch(t *testing.T) {
	tests := []struct {
		pattern, name string
		want          bool
	}{
		{"example.org", "example.org", true},
		{"example.org", "a.example.org", false},
		{"*.example.org", "a.example.org", true},
		{"*.example.org", "example.org", false},        // the apex is not covered
		{"*.example.org", "a.b.example.org", false},    // exactly one label
		{"*.example.org", "aexample.org", false},       // a label boundary, not a suffix
		{"*.example.org", "a.example.org.evil", false}, // suffix, not infix
		{"*.bücher.example", "www.xn--bcher-kva.example", true},
	}
	for _, tt := range tests {
		p, err := parsePattern(tt.pattern)
		if err != nil {
			t.Fatal(err)
		}
		name, err := NormalizeHost(tt.name)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Match(name); got != tt.want {
			t.Errorf("%s matches %s = %v; want %v", tt.pattern, tt.name, got, tt.want)
		}
	}
}

func TestNormalizeAndRecordHost(t *testing.T) {
	tests := []struct{ in, norm, record string }{
		{"WWW.Example.ORG.", "www.example.org", "www.example.org"},
		{"Bücher.Example", "xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"xn--bcher-kva.example", "xn--bcher-kva.example", "xn--bcher-kva.example"},
		{"203.0.113.10", "", "203.0.113.10"},
		{"::ffff:203.0.113.10", "", "203.0.113.10"},
		{"[2001:db8::1]", "", "2001:db8::1"},
		{"evil\x01\x1b[31m.example", "", "<invalid:18>"},
		{`a\001b.example`, "", "<invalid:14>"}, // how a DNS library escapes a control byte
		{"a b.example", "", "<invalid:11>"},
		{strings.Repeat("x", 300), "", "<invalid:300>"},
		{"<invalid:18>", "", "<invalid:18>"}, // recorded twice
		{"<malformed>", "", "<malformed>"},
		{"<invalid:1x>", "", "<invalid:12>"},
		{"<other>", "", "<invalid:7>"},
		{"12>", "", "<invalid:3>"},
	}
	for _, tt := range tests {
		n, err := NormalizeHost(tt.in)
		if (err == nil) != (tt.norm != "") || n != tt.norm {
			t.Errorf("NormalizeHost(%q) = %q, %v; want %q", tt.in, n, err, tt.norm)
		}
		if got := RecordHost(tt.in); got != tt.record {
			t.Errorf("RecordHost(%q) = %q; want %q", tt.in, got, tt.record)
		}
	}
}

// fixedLookup resolves from a table; other names do not exist.
func fixedLookup(table map[string][]string) func(context.Context, string) ([]netip.Addr, error) {
	return func(_ context.Context, name string) ([]netip.Addr, error) {
		addrs, ok := table[name]
		if !ok {
			return nil, ErrNoSuchHost
		}
		var out []netip.Addr
		for _, a := range addrs {
			out = append(out, netip.MustParseAddr(a))
		}
		return out, nil
	}
}

var testTable = map[string][]string{
	"allowed.example":   {"203.0.113.10", "2001:db8::10"},
	"a.wild.example":    {"203.0.113.11"},
	"other.example":     {"203.0.113.10"}, // same address, not allowed
	"lan.example":       {"192.168.77.10"},
	"meta.wild.example": {"169.254.169.254"},
}

// newTestFilter builds a Filter over the switches, parsed, whose names
// resolve by testTable.
func newTestFilter(t testing.TB, sw Switches, hostAddrs ...netip.Addr) *Filter {
	t.Helper()
	f, err := NewFilter(FilterConfig{Rules: parsedRules(t, sw), HostAddrs: hostAddrs, Lookup: fixedLookup(testTable)})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// parsedRules parses switches that must parse.
func parsedRules(t testing.TB, sw Switches) Rules {
	t.Helper()
	r, err := ParseRules(sw)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// dnsAnswer is what the gateway's resolver would reply.
type dnsAnswer struct {
	rcode string // NOERROR, NXDOMAIN, REFUSED, SERVFAIL
	addrs []string
}

// ask sends one DNS question through Decide and ResolveDNS as the stack
// does; a nil answer means Decide refused it.
func ask(f *Filter, name, qtype string) (Verdict, *dnsAnswer) {
	v := f.Decide(Flow{Proto: ProtoDNS, Host: strings.TrimSuffix(strings.ToLower(name), "."), QType: qtype})
	if !v.Allow {
		return v, nil
	}
	addrs, err := f.ResolveDNS(context.Background(), name, qtype)
	a := &dnsAnswer{rcode: "NOERROR"}
	switch {
	case errors.Is(err, ErrNoSuchHost):
		a.rcode = "NXDOMAIN"
	case errors.Is(err, ErrNotAllowed):
		a.rcode = "REFUSED"
	case err != nil:
		a.rcode = "SERVFAIL"
	}
	for _, ad := range addrs {
		a.addrs = append(a.addrs, ad.String())
	}
	return v, a
}

func tcpFlow(addr string, port uint16) Flow {
	return Flow{Proto: ProtoTCP, Dst: netip.AddrPortFrom(netip.MustParseAddr(addr), port)}
}

func TestFilterDNSAndPinning(t *testing.T) {
	f := newTestFilter(t, Switches{
		AllowHosts: []string{"allowed.example", "*.wild.example", "lan.example"},
		AllowCIDRs: []string{"198.51.100.0/24"},
	}, netip.MustParseAddr("198.51.100.2"))
	if got := f.Rules().Strings(); !slices.Equal(got, []string{"host:allowed.example", "host:*.wild.example", "host:lan.example", "cidr:198.51.100.0/24"}) {
		t.Errorf("rules %v", got)
	}

	// Before any DNS answer, the allowed name's address is a literal.
	if v := f.Decide(tcpFlow("203.0.113.10", 443)); v.Allow || v.Reason != ReasonLiteral {
		t.Errorf("unresolved address: %+v; want literal_address", v)
	}
	for _, tt := range []struct {
		name, qtype string
		reason      string
		rcode       string // "": refused by Decide
		answer      string
	}{
		{"Allowed.Example.", "A", ReasonAllowedHost, "NOERROR", "203.0.113.10"},
		{"allowed.example", "AAAA", ReasonAllowedHost, "NOERROR", ""},
		{"allowed.example", "TXT", ReasonDNSType, "", ""},
		{"other.example", "A", ReasonNotAllowed, "", ""},
		{"wild.example", "A", ReasonNotAllowed, "", ""},
		{"a.b.wild.example", "A", ReasonNotAllowed, "", ""},
		{"a.wild.example", "A", ReasonAllowedHost, "NOERROR", "203.0.113.11"},
		{"nx.wild.example", "A", ReasonAllowedHost, "NXDOMAIN", ""},
		{"lan.example", "A", ReasonAllowedHost, "NOERROR", "192.168.77.10"},
		{"aGVsbG8gd29ybGQgdGhpcyBpcyBleGZpbHRyYXRpb24.evil.example", "A", ReasonNotAllowed, "", ""},
	} {
		v, a := ask(f, tt.name, tt.qtype)
		if v.Reason != tt.reason || (a == nil) != (tt.rcode == "") {
			t.Errorf("%s %s: verdict %+v, answer %+v; want reason %s rcode %q", tt.name, tt.qtype, v, a, tt.reason, tt.rcode)
			continue
		}
		if a != nil && (a.rcode != tt.rcode || strings.Join(a.addrs, ",") != tt.answer) {
			t.Errorf("%s %s: %+v; want %s %q", tt.name, tt.qtype, a, tt.rcode, tt.answer)
		}
	}
	if got := f.PinnedNames(netip.MustParseAddr("203.0.113.10")); !slices.Equal(got, []string{"allowed.example"}) {
		t.Errorf("pinned names of 203.0.113.10: %v", got)
	}
	if got := f.PinnedAddrs("allowed.example"); len(got) != 1 || got[0].String() != "203.0.113.10" {
		t.Errorf("pinned addresses of allowed.example: %v (IPv6 answers are never handed out)", got)
	}

	for _, tt := range []struct {
		addr   string
		port   uint16
		allow  bool
		sniff  bool
		reason string
		host   string
	}{
		{"203.0.113.10", 443, true, true, ReasonAllowedHost, "allowed.example"},
		{"203.0.113.10", 80, true, true, ReasonAllowedHost, "allowed.example"},
		{"203.0.113.10", 22, true, false, ReasonAllowedHost, "allowed.example"},
		{"203.0.113.11", 5432, true, false, ReasonAllowedHost, "a.wild.example"},
		{"203.0.113.99", 443, false, false, ReasonLiteral, ""},
		{"8.8.8.8", 53, false, false, ReasonLiteral, ""},
		{"192.168.77.10", 80, false, false, ReasonPrivate, "lan.example"}, // rebinding: name allowed, address private
		{"192.168.77.11", 80, false, false, ReasonPrivate, ""},
		{"169.254.169.254", 80, false, false, ReasonLinkLocal, ""},
		{"198.51.100.10", 443, true, false, ReasonAllowedCIDR, ""},
		{"198.51.100.2", 443, false, false, ReasonHost, ""}, // the host's own address, inside the CIDR
	} {
		v := f.Decide(tcpFlow(tt.addr, tt.port))
		if v.Allow != tt.allow || v.Sniff != tt.sniff || v.Reason != tt.reason || v.Host != tt.host {
			t.Errorf("tcp %s:%d: %+v; want allow=%v sniff=%v reason=%s host=%q", tt.addr, tt.port, v, tt.allow, tt.sniff, tt.reason, tt.host)
		}
	}
	for _, addr := range []string{"203.0.113.10", "8.8.8.8", "198.51.100.10"} {
		v := f.Decide(Flow{Proto: ProtoUDP, Dst: netip.MustParseAddrPort(addr + ":53")})
		if v.Allow || v.Reason != ReasonNonTCP {
			t.Errorf("udp %s: %+v; want non_tcp", addr, v)
		}
	}
	if v := f.Decide(Flow{Proto: ProtoTCP, Dst: netip.MustParseAddrPort("[2001:db8::10]:443")}); v.Allow || v.Reason != ReasonIPv6 {
		t.Errorf("tcp over IPv6: %+v; want ipv6", v)
	}
	if v := f.Decide(Flow{Proto: ProtoDNS, Host: `evil\001\027.example`, QType: "A"}); v.Allow || v.Reason != ReasonInvalidName || v.Host != "<invalid:20>" {
		t.Errorf("hostile DNS name: %+v", v)
	}
}

func TestFilterDenyAllAndPrivate(t *testing.T) {
	deny := newTestFilter(t, Switches{DenyAll: true})
	if v, _ := ask(deny, "allowed.example", "A"); v.Allow || v.Reason != ReasonNotAllowed {
		t.Errorf("deny-all DNS: %+v", v)
	}
	if v := deny.Decide(tcpFlow("203.0.113.10", 443)); v.Allow {
		t.Errorf("deny-all TCP: %+v", v)
	}
	lan := newTestFilter(t, Switches{AllowHosts: []string{"lan.example"}, AllowLAN: true})
	ask(lan, "lan.example", "A")
	if v := lan.Decide(tcpFlow("192.168.77.10", 5432)); !v.Allow {
		t.Errorf("allowed name on a private address with AllowPrivate: %+v", v)
	}
	cidr := newTestFilter(t, Switches{AllowCIDRs: []string{"192.168.77.0/24", "169.254.0.0/16"}})
	if v := cidr.Decide(tcpFlow("192.168.77.10", 80)); !v.Allow || v.Reason != ReasonAllowedCIDR {
		t.Errorf("private address in an allowed CIDR: %+v", v)
	}
	if v := cidr.Decide(tcpFlow("169.254.169.254", 80)); v.Allow {
		t.Errorf("link-local stays refused even inside a CIDR: %+v", v)
	}
}

func TestFilterSniff(t *testing.T) {
	f := newTestFilter(t, Switches{AllowHosts: []string{"allowed.example"}})
	ask(f, "allowed.example", "A")
	fl := tcpFlow("203.0.113.10", 443)
	for _, tt := range []struct {
		name, from string
		allow      bool
		reason     string
		host       string
	}{
		{"allowed.example", HostFromSNI, true, ReasonAllowedHost, "allowed.example"},
		{"ALLOWED.example.", HostFromSNI, true, ReasonAllowedHost, "allowed.example"},
		{"other.example", HostFromSNI, false, ReasonSNIMismatch, "other.example"},
		{"", HostFromSNI, false, ReasonSNIMismatch, ""}, // no SNI at all
		{"allowed.example", HostFromHTTP, true, ReasonAllowedHost, "allowed.example"},
		{"other.example", HostFromHTTP, false, ReasonHostMismatch, "other.example"},
		{"203.0.113.10", HostFromHTTP, false, ReasonHostMismatch, "203.0.113.10"},
		{"evil\x1b.example", HostFromHTTP, false, ReasonHostMismatch, "<invalid:13>"},
		{"", HostFromHTTP, false, ReasonHostMismatch, ""},
	} {
		in := fl
		in.Host, in.HostFrom = tt.name, tt.from
		v := f.Sniff(in)
		if v.Allow != tt.allow || v.Reason != tt.reason || v.Host != tt.host {
			t.Errorf("sniff %s %q: %+v; want allow=%v %s host %q", tt.from, tt.name, v, tt.allow, tt.reason, tt.host)
		}
		if v.Allow && v.Dial != fl.Dst {
			t.Errorf("sniff allowed but dials %v, not %v", v.Dial, fl.Dst)
		}
	}
}

func BenchmarkFilterDecide(b *testing.B) {
	f := newTestFilter(b, Switches{AllowHosts: []string{"allowed.example", "*.wild.example"}, AllowCIDRs: []string{"198.51.100.0/24"}})
	ask(f, "allowed.example", "A")
	flows := []Flow{tcpFlow("203.0.113.10", 443), tcpFlow("203.0.113.99", 443), tcpFlow("198.51.100.10", 22)}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		f.Decide(flows[i%len(flows)])
	}
}

func BenchmarkFilterSniff(b *testing.B) {
	f := newTestFilter(b, Switches{AllowHosts: []string{"allowed.example"}})
	ask(f, "allowed.example", "A")
	fl := tcpFlow("203.0.113.10", 443)
	fl.Host, fl.HostFrom = "allowed.example", HostFromSNI
	b.ReportAllocs()
	for b.Loop() {
		f.Sniff(fl)
	}
}
