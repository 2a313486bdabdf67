package egress

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
)

// Target is where a proxy request goes, once judged.
type Target struct {
	Host  string         // the name asked for (normalised), or the address's text
	Dial  netip.AddrPort // zero unless allowed
	Names []string       // names the destination belongs to (for the checks of what the tunnel carries)
}

// Judge decides a proxy request for host:port, where host is a name or an
// address literal as the guest wrote it. A credential's host (or an
// address pinned with it) is refused before any rule. A name must match a
// rule; it is
// resolved here and the proxy dials the first of its addresses that the
// policy allows, never an address the guest chose. A literal address is
// allowed only by a CIDR (handed-out addresses do not count here, so that
// a tunnel cannot skip the name checks). The returned Target carries the
// recorded host whether or not the verdict allows. An error means an
// allowed name could not be resolved (the verdict then says dial_failed).
func (f *Filter) Judge(ctx context.Context, host string, port uint16) (Target, Verdict, error) {
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		a = a.Unmap()
		t := Target{Host: a.String()}
		if v, ok := f.pinnedVerdict(a, nil); ok {
			return t, v, nil
		}
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
	if f.PinnedName(name) {
		return t, Verdict{Reason: ReasonPinnedCredential, Host: name}, nil
	}
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
