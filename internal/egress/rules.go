package egress

import (
	"fmt"
	"net/netip"
	"slices"

	"isopod/internal/errdefs"
)

// Mode is the network a run gets.
type Mode string

// The networks a run can have.
const (
	// ModeOff: no NIC at all.
	ModeOff Mode = "none"
	// ModeNAT: the public internet, through the host's userspace NAT
	// ([PublicOnly]).
	ModeNAT Mode = "nat"
	// ModeFiltered: default deny, by allowlist ([Filter]).
	ModeFiltered Mode = "filtered"
)

// Switches are a run's network switches as a front end takes them (the
// --no-network, --allow-lan-egress, --allow-host, --allow-cidr and
// --deny-egress flags, or their MCP arguments), not yet parsed. [ParseRules]
// turns them into [Rules].
type Switches struct {
	NoNetwork bool
	AllowLAN  bool
	// AllowHosts and AllowCIDRs are the rules as given. A nil list was not
	// given; a non-nil empty one was (MCP's allow_hosts: []) and asks for
	// filtered egress like a rule does.
	AllowHosts []string
	AllowCIDRs []string
	DenyAll    bool
}

// Mode says which network s asks for: ModeOff with NoNetwork; ModeFiltered
// with DenyAll or either allow list given, even empty; otherwise ModeNAT.
// It reads no rule: a switch that does not parse is [ParseRules]'s to refuse.
func (s Switches) Mode() Mode {
	switch {
	case s.NoNetwork:
		return ModeOff
	case s.DenyAll || s.AllowHosts != nil || s.AllowCIDRs != nil:
		return ModeFiltered
	}
	return ModeNAT
}

// Rules is a run's network policy, parsed: the one form everything after
// a request's validation uses (the network assembly, [Filter], the proxies
// and the flight recorder). The zero value is ModeNAT without the LAN.
type Rules struct {
	mode     Mode
	hosts    []Pattern
	cidrs    []netip.Prefix
	denyAll  bool
	allowLAN bool
}

// ParseRules checks the switches against each other and parses every rule,
// once. A refusal wraps errdefs.ErrInvalidArgument and names the switch,
// the value and the fix. Duplicate rules collapse; filtered egress without
// a rule allows nothing (DenyAll).
func ParseRules(s Switches) (Rules, error) {
	if s.NoNetwork && (s.DenyAll || s.AllowHosts != nil || s.AllowCIDRs != nil || s.AllowLAN) {
		return Rules{}, fmt.Errorf("--no-network cannot be combined with --allow-host, --allow-cidr, --deny-egress or --allow-lan-egress: a run has no NIC or a filtered one, pick one: %w", errdefs.ErrInvalidArgument)
	}
	if s.DenyAll && (len(s.AllowHosts) > 0 || len(s.AllowCIDRs) > 0) {
		return Rules{}, fmt.Errorf("--deny-egress cannot be combined with --allow-host or --allow-cidr: deny-egress allows nothing; drop one: %w", errdefs.ErrInvalidArgument)
	}
	r := Rules{mode: s.Mode(), allowLAN: s.AllowLAN}
	for _, c := range s.AllowCIDRs {
		p, err := parseCIDR(c)
		if err != nil {
			return Rules{}, err // names the flag and the value
		}
		if !slices.Contains(r.cidrs, p) {
			r.cidrs = append(r.cidrs, p)
		}
	}
	for _, h := range s.AllowHosts {
		p, err := parsePattern(h)
		if err != nil {
			return Rules{}, err // names the flag and the value
		}
		if !slices.Contains(r.hosts, p) {
			r.hosts = append(r.hosts, p)
		}
	}
	r.denyAll = r.mode == ModeFiltered && len(r.hosts) == 0 && len(r.cidrs) == 0
	return r, nil
}

// Mode is the network the rules give; the zero Rules is ModeNAT.
func (r Rules) Mode() Mode {
	if r.mode == "" {
		return ModeNAT
	}
	return r.mode
}

// DenyAll reports whether the rules are filtered egress that allows
// nothing (--deny-egress, or filtered without a rule).
func (r Rules) DenyAll() bool { return r.denyAll }

// AllowLAN reports whether allowed destinations may be private or CGNAT
// addresses (--allow-lan-egress).
func (r Rules) AllowLAN() bool { return r.allowLAN }

// Hosts are the host-name rules, without duplicates, in the order given.
func (r Rules) Hosts() []Pattern { return slices.Clone(r.hosts) }

// CIDRs are the address ranges, masked, without duplicates, in the order
// given.
func (r Rules) CIDRs() []netip.Prefix { return slices.Clone(r.cidrs) }

// Strings lists the normalised rules ("host:NAME", "cidr:PREFIX"), as the
// report's allowed_rules.
func (r Rules) Strings() []string {
	out := []string{}
	for _, p := range r.hosts {
		out = append(out, "host:"+p.String())
	}
	for _, c := range r.cidrs {
		out = append(out, "cidr:"+c.String())
	}
	return out
}

// parseCIDR parses an --allow-cidr value: a prefix or a single address.
func parseCIDR(s string) (netip.Prefix, error) {
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
