package egress

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"sync"

	"isopod/internal/errdefs"
)

// Errors of a Filter's name service.
var (
	// ErrNoSuchHost is what a [FilterConfig.Lookup] returns for a name that
	// does not exist (the DNS answer is then NXDOMAIN, not SERVFAIL).
	ErrNoSuchHost = errors.New("no such host")
	// ErrNotAllowed is what [Filter.ResolveDNS] returns for a query it does
	// not answer (the DNS answer is then REFUSED).
	ErrNotAllowed = errors.New("query not allowed")
)

// FilterConfig configures a [Filter].
type FilterConfig struct {
	// Rules are the run's parsed policy ([ParseRules]); their mode must be
	// ModeFiltered.
	Rules Rules
	// HostAddrs are the host's own addresses, refused whatever the rules.
	HostAddrs []netip.Addr
	// Lookup resolves an allowed name to its IPv4 addresses for the DNS
	// answers and the proxies; ErrNoSuchHost for a missing name. Required.
	Lookup func(ctx context.Context, name string) ([]netip.Addr, error)
	// Pinned are the hosts of the credentials the run injects, and the
	// addresses they resolved to when the network started (credpin.go):
	// their DNS answers, proxy requests and connections are refused with
	// ReasonPinnedCredential before any rule is consulted.
	Pinned Pins
}

// Validate checks c. The rules were checked when they were parsed.
func (c *FilterConfig) Validate() error {
	if c.Lookup == nil {
		return fmt.Errorf("egress filter: no Lookup function: %w", errdefs.ErrInvalidArgument)
	}
	if m := c.Rules.Mode(); m != ModeFiltered {
		return fmt.Errorf("egress filter: the rules are for a %s network, not filtered egress: %w", m, errdefs.ErrInvalidArgument)
	}
	return nil
}

// Filter is the policy of filtered egress: default deny, names by
// allowlist, addresses by CIDR or by having been handed out in a DNS answer
// for an allowed name. It is a [Policy] and a [Sniffer] (on ports 80 and
// 443 every name a connection carries must be a name its address was
// handed out for); it answers the gateway resolver's queries
// ([Filter.ResolveDNS]) and judges proxy requests ([Filter.Judge]). Safe
// for concurrent use.
type Filter struct {
	rules     Rules
	hostAddrs []netip.Addr
	pins      Pins
	lookup    func(ctx context.Context, name string) ([]netip.Addr, error)

	mu     sync.RWMutex // guards following
	byAddr map[netip.Addr][]string
	byName map[string][]netip.Addr
}

var _ Sniffer = (*Filter)(nil)

// NewFilter builds a Filter over parsed rules.
func NewFilter(cfg FilterConfig) (*Filter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Filter{rules: cfg.Rules, lookup: cfg.Lookup, pins: cfg.Pinned,
		byAddr: make(map[netip.Addr][]string), byName: make(map[string][]netip.Addr)}
	for _, a := range cfg.HostAddrs {
		f.hostAddrs = append(f.hostAddrs, a.Unmap())
	}
	return f, nil
}

// Rules are the rules f applies.
func (f *Filter) Rules() Rules { return f.rules }

// AllowsName reports whether the normalised name matches a rule.
func (f *Filter) AllowsName(name string) bool {
	if f.rules.denyAll {
		return false
	}
	for _, p := range f.rules.hosts {
		if p.Match(name) {
			return true
		}
	}
	return false
}

// inCIDR reports whether a is in an allowed range.
func (f *Filter) inCIDR(a netip.Addr) bool {
	for _, c := range f.rules.cidrs {
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
	case cat == CatPublic, lan && f.rules.allowLAN:
		return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: host}
	}
	return Verdict{Reason: CategoryReason(cat), Host: host}
}

// Decide implements Policy.
func (f *Filter) Decide(fl Flow) Verdict {
	switch fl.Proto {
	case ProtoDNS:
		return f.decideDNS(fl)
	case ProtoTCP:
		dst := fl.Dst.Addr().Unmap()
		names := f.PinnedNames(dst)
		if v, ok := f.pinnedVerdict(dst, names); ok {
			return v
		}
		v := f.addrVerdict(dst, names)
		if v.Allow && v.Reason == ReasonAllowedHost && SniffPort(fl.Dst.Port()) {
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

func (f *Filter) decideDNS(fl Flow) Verdict {
	name, err := NormalizeHost(fl.Host)
	switch {
	case err != nil:
		return Verdict{Reason: ReasonInvalidName, Host: RecordHost(fl.Host)}
	case f.PinnedName(name):
		return Verdict{Reason: ReasonPinnedCredential, Host: name}
	case !f.AllowsName(name):
		return Verdict{Reason: ReasonNotAllowed, Host: name}
	case fl.QType != "A" && fl.QType != "AAAA", fl.QClass != "" && fl.QClass != "IN":
		return Verdict{Reason: ReasonDNSType, Host: name}
	}
	return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: name}
}

// SniffPort reports whether connections to port p must carry the name they
// are for (HTTP and HTTPS).
func SniffPort(p uint16) bool { return p == 80 || p == 443 }

// Sniff implements Sniffer: a name a connection to an address handed out
// for allowed names carries must be one of those names. An allowed verdict
// dials the address the guest dialled, which is one of the name's own
// addresses.
func (f *Filter) Sniff(fl Flow) Verdict {
	dst := fl.Dst.Addr().Unmap()
	if n, err := NormalizeHost(fl.Host); err == nil && f.PinnedName(n) {
		return Verdict{Reason: ReasonPinnedCredential, Host: n}
	}
	v := MatchName(fl.Host, fl.HostFrom, f.PinnedNames(dst))
	if v.Allow {
		v.Dial = netip.AddrPortFrom(dst, fl.Dst.Port())
	}
	return v
}

// MatchName judges a name a connection carries, raw as the guest sent it
// ("" for none) and found where from says, against the names the
// connection is for. A refusal is sni_mismatch or host_mismatch by from,
// and names the offending name as the record shows it.
func MatchName(raw, from string, names []string) Verdict {
	reason := ReasonHostMismatch
	if from == HostFromSNI {
		reason = ReasonSNIMismatch
	}
	if raw == "" {
		return Verdict{Reason: reason}
	}
	name, err := NormalizeHost(raw)
	if err != nil {
		return Verdict{Reason: reason, Host: RecordHost(raw)}
	}
	if !slices.Contains(names, name) {
		return Verdict{Reason: reason, Host: name}
	}
	return Verdict{Allow: true, Reason: ReasonAllowedHost, Host: name}
}
