package egress

import (
	"net/netip"
	"slices"
	"strconv"
)

// Attempt is what [Suggest] reads of one recorded event.
type Attempt struct {
	Proto   string // ProtoTCP, ProtoDNS, ProtoHTTPProxy, ...
	Host    string // as recorded: a normalised name, an address, or a placeholder
	Port    uint16
	Allowed bool
	Reason  string
	QType   string // ProtoDNS only
}

// Suggestion is the smallest allowlist that would have allowed what a
// recorded run tried: exact names (never widened to wildcards) and single
// addresses, as flags to pass to the next run.
type Suggestion struct {
	AllowHosts []string `json:"allow_hosts"`
	AllowCIDRs []string `json:"allow_cidrs"`
	Flags      []string `json:"flags"`
	// Unallowable lists attempts no rule can allow (non-TCP traffic, the
	// host's own or special addresses, malformed names and messages),
	// "proto host:port (reason)", deduplicated.
	Unallowable []string `json:"unallowable"`
	Events      int      `json:"events"`
}

// Suggest derives a Suggestion from a run's egress record. Every name the
// guest asked for (by DNS with type A or AAAA, through a proxy, or in the
// SNI/Host of a connection) becomes an exact --allow-host; every literal
// public address it dialled becomes an --allow-cidr of that one address.
// Names that resolved to private addresses are included as names; reaching
// those still needs an explicit CIDR, which is not suggested. A credential's
// pinned host is never suggested: only its endpoint reaches it.
func Suggest(attempts []Attempt) Suggestion {
	s := Suggestion{AllowHosts: []string{}, AllowCIDRs: []string{}, Flags: []string{}, Unallowable: []string{}, Events: len(attempts)}
	hosts := map[string]bool{}
	cidrs := map[string]bool{}
	unallowable := map[string]bool{}
	for _, e := range attempts {
		a, aerr := netip.ParseAddr(e.Host)
		isAddr := aerr == nil
		switch {
		case e.Host == "" || e.Proto == ProtoCredential:
			// Credential endpoint requests obey their alias's rules, not these.
		case e.Reason == ReasonPinnedCredential:
			unallowable[e.Proto+" "+hostPort(e)+" ("+e.Reason+")"] = true
		case IsPlaceholder(e.Host):
			reason := ReasonInvalidName
			if e.Host == MalformedHost {
				reason = ReasonMalformed
			}
			unallowable[e.Proto+" "+e.Host+" ("+reason+")"] = true
		case e.Proto == ProtoDNS:
			if e.QType == "A" || e.QType == "AAAA" {
				hosts[e.Host] = true
			}
		case e.Reason == ReasonNonTCP || e.Proto == ProtoUDP || e.Proto == ProtoICMP:
			unallowable[e.Proto+" "+hostPort(e)+" ("+ReasonNonTCP+")"] = true
		case !isAddr:
			hosts[e.Host] = true
		case e.Reason == ReasonLiteral || (e.Allowed && e.Reason == ReasonAllowedCIDR):
			a = a.Unmap()
			cidrs[netip.PrefixFrom(a, a.BitLen()).String()] = true
		case !e.Allowed && e.Reason != ReasonAllowedHost:
			unallowable[e.Proto+" "+hostPort(e)+" ("+e.Reason+")"] = true
		}
	}
	s.AllowHosts = sortedKeys(hosts)
	s.AllowCIDRs = sortedKeys(cidrs)
	s.Unallowable = sortedKeys(unallowable)
	for _, h := range s.AllowHosts {
		s.Flags = append(s.Flags, "--allow-host", h)
	}
	for _, c := range s.AllowCIDRs {
		s.Flags = append(s.Flags, "--allow-cidr", c)
	}
	return s
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func hostPort(e Attempt) string {
	if e.Port == 0 {
		return e.Host
	}
	return e.Host + ":" + strconv.Itoa(int(e.Port))
}
