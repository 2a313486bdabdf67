package egress

import (
	"fmt"
	"net/netip"
	"slices"

	"isopod/internal/errdefs"
)

// Credential hosts. A run that injects credentials names, for each, the
// one host its secret is sent to; only the VM's credential endpoint
// reaches that host. The Filter refuses the guest's own way there, with
// ReasonPinnedCredential, before it looks at any rule: a name no allow
// rule (even a wildcard covering it) opens, and the addresses resolved
// for it when the network started.

// Pins are a run's credential hosts, parsed ([ParsePins]); the zero
// value pins nothing.
type Pins struct {
	names map[string]bool
	addrs []netip.Addr
}

// ParsePins checks and normalises the credential hosts names and the
// addresses they resolved to.
func ParsePins(names []string, addrs []netip.Addr) (Pins, error) {
	p := Pins{names: make(map[string]bool, len(names))}
	for _, h := range names {
		n, err := NormalizeHost(h)
		if err != nil {
			return Pins{}, fmt.Errorf("egress filter: pinned credential host %q: %w", RecordHost(h), errdefs.ErrInvalidArgument)
		}
		p.names[n] = true
	}
	for _, a := range addrs {
		if a = a.Unmap(); !slices.Contains(p.addrs, a) {
			p.addrs = append(p.addrs, a)
		}
	}
	return p, nil
}

// Names are the pinned names, normalised, in no order.
func (p Pins) Names() []string {
	var out []string
	for n := range p.names {
		out = append(out, n)
	}
	return out
}

// PinnedName reports whether the normalised name is a credential's host.
func (f *Filter) PinnedName(name string) bool { return f.pins.names[name] }

// pinnedVerdict is the refusal of a connection to a that no allowed
// name was handed out for (names empty) when a was resolved for a
// credential's host, or of one handed out for such a host.
func (f *Filter) pinnedVerdict(a netip.Addr, names []string) (Verdict, bool) {
	for _, n := range names {
		if f.pins.names[n] {
			return Verdict{Reason: ReasonPinnedCredential, Host: n}, true
		}
	}
	if len(names) == 0 && slices.Contains(f.pins.addrs, a.Unmap()) {
		return Verdict{Reason: ReasonPinnedCredential}, true
	}
	return Verdict{}, false
}
