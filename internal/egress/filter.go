package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/miekg/dns"

	"isopod/internal/errdefs"
)

// Reasons of the filtered policy. Together with the category reasons
// (private_destination, link_local, host_address, ...) they form the
// documented enum of the egress record.
const (
	ReasonAllowedHost  = "allowed_host"    // a name the allowlist matches, or an address handed out for one
	ReasonAllowedCIDR  = "allowed_cidr"    // an address in an --allow-cidr range
	ReasonNotAllowed   = "not_allowed"     // a name no rule matches (everything, with --deny-egress)
	ReasonLiteral      = "literal_address" // an address no rule allows and no allowed name resolved to
	ReasonSNIMismatch  = "sni_mismatch"    // TLS server_name missing or not the name the address belongs to
	ReasonHostMismatch = "host_mismatch"   // HTTP Host missing or not the name the address belongs to
	ReasonNonTCP       = "non_tcp"         // UDP other than DNS to the gateway, ICMP beyond it
	ReasonIPv6         = "ipv6"            // IPv6 destinations: the guest has no IPv6 egress
	ReasonInvalidName  = "invalid_name"    // not a well-formed host name
	ReasonDNSType      = "dns_type"        // a DNS query type other than A and AAAA
	ReasonBadRequest   = "bad_request"     // a malformed or unsupported proxy request
)

// Proxy flow kinds in [Event.Proto], beside ProtoTCP and friends.
const (
	ProtoHTTPProxy = "http_proxy"
	ProtoSOCKS     = "socks5"
)

// ErrNoSuchHost is what a [FilterConfig.Lookup] returns for a name that
// does not exist (the DNS answer is then NXDOMAIN, not SERVFAIL).
var ErrNoSuchHost = errors.New("no such host")

// Limits of the pinning table.
const (
	maxPinnedNames    = 1 << 16
	maxNamesPerAddr   = 64
	maxAddrsPerAnswer = 16
	dnsAnswerTTL      = 30
)

// FilterConfig configures a [Filter].
type FilterConfig struct {
	// AllowHosts are --allow-host rules (see [ParsePattern]).
	AllowHosts []string
	// AllowCIDRs are --allow-cidr ranges ("ADDR/BITS" or one address).
	AllowCIDRs []string
	// DenyAll allows nothing (and must come without rules).
	DenyAll bool
	// AllowPrivate lets allowed names resolve to private and CGNAT
	// addresses (--allow-lan-egress); otherwise only a CIDR allows those.
	AllowPrivate bool
	// HostAddrs are the host's own addresses, refused whatever the rules.
	HostAddrs []netip.Addr
	// Lookup resolves an allowed name to its IPv4 addresses for the DNS
	// answers and the proxies; ErrNoSuchHost for a missing name. Required.
	Lookup func(ctx context.Context, name string) ([]netip.Addr, error)
}

// Validate checks c.
func (c *FilterConfig) Validate() error {
	if c.Lookup == nil {
		return fmt.Errorf("egress filter: no Lookup function: %w", errdefs.ErrInvalidArgument)
	}
	if c.DenyAll && (len(c.AllowHosts) > 0 || len(c.AllowCIDRs) > 0) {
		return fmt.Errorf("egress filter: deny-all with allow rules; pick one: %w", errdefs.ErrInvalidArgument)
	}
	for _, h := range c.AllowHosts {
		if _, err := ParsePattern(h); err != nil {
			return err
		}
	}
	for _, s := range c.AllowCIDRs {
		if _, err := ParseCIDR(s); err != nil {
			return err
		}
	}
	return nil
}

// ParseCIDR parses an --allow-cidr value: a prefix or a single address.
func ParseCIDR(s string) (netip.Prefix, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-unmapBits(p.Addr())).Masked(), nil
	}
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		return netip.PrefixFrom(a, a.BitLen()), nil
	}
	return netip.Prefix{}, fmt.Errorf("--allow-cidr %q: want ADDR/BITS (e.g. 203.0.113.0/24) or one address: %w", s, errdefs.ErrInvalidArgument)
}

func unmapBits(a netip.Addr) int {
	if a.Is4In6() {
		return 96
	}
	return 0
}

// Filter is the policy of filtered egress: default deny, names by
// allowlist, addresses by CIDR or by having been handed out in a DNS answer
// for an allowed name. It is a [Policy], a [Sniffer] (ports 80 and 443:
// the TLS SNI or HTTP Host must be the name the address was handed out
// for), and a DNS handler for the gateway resolver (its ServeDNS method has
// the signature the network stack expects). Safe for concurrent use.
type Filter struct {
	patterns     []Pattern
	cidrs        []netip.Prefix
	denyAll      bool
	allowPrivate bool
	hostAddrs    []netip.Addr
	lookup       func(ctx context.Context, name string) ([]netip.Addr, error)

	mu     sync.RWMutex
	byAddr map[netip.Addr][]string // address -> allowed names it was handed out for
	byName map[string][]netip.Addr
}

// NewFilter builds a Filter.
func NewFilter(cfg FilterConfig) (*Filter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Filter{denyAll: cfg.DenyAll, allowPrivate: cfg.AllowPrivate, lookup: cfg.Lookup,
		byAddr: make(map[netip.Addr][]string), byName: make(map[string][]netip.Addr)}
	for _, h := range cfg.AllowHosts {
		p, _ := ParsePattern(h)
		if !slices.Contains(f.patterns, p) {
			f.patterns = append(f.patterns, p)
		}
	}
	for _, s := range cfg.AllowCIDRs {
		p, _ := ParseCIDR(s)
		if !slices.Contains(f.cidrs, p) {
			f.cidrs = append(f.cidrs, p)
		}
	}
	for _, a := range cfg.HostAddrs {
		f.hostAddrs = append(f.hostAddrs, a.Unmap())
	}
	return f, nil
}

// Rules lists the normalised rules, as the report's allowed_rules.
func (f *Filter) Rules() []string {
	out := []string{}
	for _, p := range f.patterns {
		out = append(out, "host:"+p.String())
	}
	for _, c := range f.cidrs {
		out = append(out, "cidr:"+c.String())
	}
	return out
}

// AllowsName reports whether the normalised name matches a rule.
func (f *Filter) AllowsName(name string) bool {
	if f.denyAll {
		return false
	}
	for _, p := range f.patterns {
		if p.Match(name) {
			return true
		}
	}
	return false
}

// inCIDR reports whether a is in an allowed range.
func (f *Filter) inCIDR(a netip.Addr) bool {
	for _, c := range f.cidrs {
		if c.Contains(a) {
			return true
		}
	}
	return false
}

// addrVerdict judges a destination address that is known to belong to
// names (nil: a literal address). A CIDR allows public, private and CGNAT
// destinations; the host's own addresses and the special ranges (loopback,
// link-local, ...) are refused whatever the rules.
func (f *Filter) addrVerdict(a netip.Addr, names []string) Verdict {
	a = a.Unmap()
	var host string
	if len(names) > 0 {
		host = names[0]
	}
	if a.Is6() {
		return Verdict{Reason: ReasonIPv6, Host: host}
	}
	if slices.Contains(f.hostAddrs, a) {
		return Verdict{Reason: ReasonHost, Host: host}
	}
	cat := Category(a)
	lan := cat == CatPrivate || cat == CatCGNAT
	if f.inCIDR(a) && (cat == CatPublic || lan) {
		return Verdict{Allow: true, Reason: ReasonAllowedCIDR, Host: host}
	}
	switch {
	case len(names) == 0 && cat == CatPublic:
		return Verdict{Reason: ReasonLiteral}
	case len(names) == 0:
		return Verdict{Reason: CategoryReason(cat)}
	case cat == CatPublic, lan && f.allowPrivate:
		return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: host}
	}
	return Verdict{Reason: CategoryReason(cat), Host: host}
}

// Decide implements Policy.
func (f *Filter) Decide(fl Flow) Verdict {
	switch fl.Proto {
	case ProtoDNS:
		name, err := NormalizeHost(fl.Host)
		if err != nil {
			return Verdict{Reason: ReasonInvalidName, Host: RecordHost(fl.Host)}
		}
		if !f.AllowsName(name) {
			return Verdict{Reason: ReasonNotAllowed, Host: name}
		}
		if fl.QType != "A" && fl.QType != "AAAA" {
			return Verdict{Reason: ReasonDNSType, Host: name}
		}
		return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: name}
	case ProtoTCP:
		dst := fl.Dst.Addr().Unmap()
		names := f.PinnedNames(dst)
		v := f.addrVerdict(dst, names)
		if v.Allow && v.Reason == ReasonAllowedHost && sniffPort(fl.Dst.Port()) {
			v.Sniff = true
		}
		return v
	default:
		v := f.addrVerdict(fl.Dst.Addr(), f.PinnedNames(fl.Dst.Addr().Unmap()))
		if v.Allow || v.Reason == ReasonAllowedHost || v.Reason == ReasonLiteral {
			return Verdict{Reason: ReasonNonTCP, Host: v.Host}
		}
		return Verdict{Reason: v.Reason, Host: v.Host}
	}
}

func sniffPort(p uint16) bool { return p == 80 || p == 443 }

// Sniff implements Sniffer: the TLS SNI or HTTP Host of a connection to an
// address handed out for allowed names must be one of those names. The
// connection then goes to the address the guest dialled, which is one of
// the name's own addresses.
func (f *Filter) Sniff(fl Flow, head []byte) (Verdict, bool) {
	dst := fl.Dst.Addr().Unmap()
	return f.matchHead(head, f.PinnedNames(dst), netip.AddrPortFrom(dst, fl.Dst.Port()))
}

// matchHead judges a connection's first bytes against the names its
// destination belongs to.
func (f *Filter) matchHead(head []byte, names []string, dial netip.AddrPort) (Verdict, bool) {
	raw, reason, err := headName(head)
	if NeedMore(err) {
		return Verdict{Reason: reason}, true
	}
	if err != nil || raw == "" {
		return Verdict{Reason: reason}, false
	}
	name, nerr := NormalizeHost(raw)
	if nerr != nil {
		return Verdict{Reason: reason, Host: RecordHost(raw)}, false
	}
	if !slices.Contains(names, name) {
		return Verdict{Reason: reason, Host: name}, false
	}
	return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: name, Dial: dial}, false
}

// Pin remembers that addrs were handed out for the allowed name.
func (f *Filter) Pin(name string, addrs []netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byName[name]; !ok && len(f.byName) >= maxPinnedNames {
		// Full: forget an arbitrary name. Its addresses stop being
		// reachable until it is resolved again.
		for old, oldAddrs := range f.byName {
			delete(f.byName, old)
			for _, a := range oldAddrs {
				f.byAddr[a] = slices.DeleteFunc(f.byAddr[a], func(n string) bool { return n == old })
				if len(f.byAddr[a]) == 0 {
					delete(f.byAddr, a)
				}
			}
			break
		}
	}
	for _, a := range addrs {
		a = a.Unmap()
		if !slices.Contains(f.byName[name], a) {
			f.byName[name] = append(f.byName[name], a)
		}
		if ns := f.byAddr[a]; !slices.Contains(ns, name) && len(ns) < maxNamesPerAddr {
			f.byAddr[a] = append(ns, name)
		}
	}
}

// PinnedNames lists the allowed names a was handed out for.
func (f *Filter) PinnedNames(a netip.Addr) []string {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Clone(f.byAddr[a.Unmap()])
}

// PinnedAddrs lists the addresses handed out for name.
func (f *Filter) PinnedAddrs(name string) []netip.Addr {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return slices.Clone(f.byName[name])
}

// ServeDNS answers a query that Decide allowed (an A or AAAA question for
// an allowed name). A: the name's IPv4 addresses through Lookup, each
// remembered in the pinning table. AAAA: an empty answer (no IPv6 egress).
// Anything else: REFUSED. Nil means SERVFAIL.
func (f *Filter) ServeDNS(ctx context.Context, _ netip.AddrPort, q *dns.Msg) *dns.Msg {
	reply := new(dns.Msg).SetReply(q)
	reply.RecursionAvailable = true
	if len(q.Question) != 1 {
		return reply.SetRcode(q, dns.RcodeFormatError)
	}
	qq := q.Question[0]
	name, err := NormalizeHost(qq.Name)
	if err != nil || !f.AllowsName(name) || qq.Qclass != dns.ClassINET {
		return reply.SetRcode(q, dns.RcodeRefused)
	}
	switch qq.Qtype {
	case dns.TypeAAAA:
		return reply
	case dns.TypeA:
	default:
		return reply.SetRcode(q, dns.RcodeRefused)
	}
	addrs, err := f.resolve(ctx, name)
	if errors.Is(err, ErrNoSuchHost) {
		return reply.SetRcode(q, dns.RcodeNameError)
	}
	if err != nil {
		return nil
	}
	hdr := dns.RR_Header{Name: qq.Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: dnsAnswerTTL}
	for _, a := range addrs {
		reply.Answer = append(reply.Answer, &dns.A{Hdr: hdr, A: a.AsSlice()})
	}
	return reply
}

// resolve looks name up, keeps at most a few IPv4 addresses and pins them.
func (f *Filter) resolve(ctx context.Context, name string) ([]netip.Addr, error) {
	addrs, err := f.lookup(ctx, name)
	if err != nil {
		return nil, err
	}
	var v4 []netip.Addr
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() && !slices.Contains(v4, a) {
			v4 = append(v4, a)
		}
		if len(v4) == maxAddrsPerAnswer {
			break
		}
	}
	if len(v4) == 0 {
		return nil, ErrNoSuchHost
	}
	f.Pin(name, v4)
	return v4, nil
}

// Target is where a proxy request goes, once judged.
type Target struct {
	Host  string         // the name asked for (normalised), or the address's text
	Dial  netip.AddrPort // zero unless allowed
	Names []string       // names the destination belongs to (for the first-bytes check)
}

// Judge decides a proxy request for host:port, where host is a name or an
// address literal as the guest wrote it. A name must match a rule; it is
// resolved here and the proxy dials the first of its addresses that the
// policy allows, never an address the guest chose. A literal address is
// allowed only by a CIDR (handed-out addresses do not count here, so that
// a tunnel cannot skip the SNI check). The returned Target carries the
// recorded host whether or not the verdict allows.
func (f *Filter) Judge(ctx context.Context, host string, port uint16) (Target, Verdict, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		a = a.Unmap()
		t := Target{Host: a.String()}
		v := f.addrVerdict(a, nil)
		if v.Allow {
			t.Dial = netip.AddrPortFrom(a, port)
		}
		return t, v, nil
	}
	name, err := NormalizeHost(host)
	if err != nil {
		return Target{Host: RecordHost(host)}, Verdict{Reason: ReasonInvalidName}, nil
	}
	t := Target{Host: name, Names: []string{name}}
	if !f.AllowsName(name) {
		return t, Verdict{Reason: ReasonNotAllowed, Host: name}, nil
	}
	addrs, err := f.resolve(ctx, name)
	if err != nil {
		return t, Verdict{Allow: true, Reason: ReasonDialFailed, Host: name}, fmt.Errorf("resolving %s: %w", name, err)
	}
	var last Verdict
	for _, a := range addrs {
		last = f.addrVerdict(a, []string{name})
		if last.Allow {
			t.Dial = netip.AddrPortFrom(a, port)
			return t, last, nil
		}
	}
	return t, last, nil
}
