package egress

import (
	"context"
	"net/netip"
	"slices"
)

// Limits of the pinning table.
const (
	maxPinnedNames    = 1 << 16
	maxNamesPerAddr   = 64
	maxAddrsPerAnswer = 16
)

// Pin remembers that addrs were handed out for the allowed name.
func (f *Filter) Pin(name string, addrs []netip.Addr) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.byName[name]; !ok && len(f.byName) >= maxPinnedNames {
		f.forgetOne()
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

// forgetOne drops an arbitrary pinned name. Its addresses stop being
// reachable until it is resolved again.
//
// Preconditions: f.mu is held for writing.
func (f *Filter) forgetOne() {
	for old, oldAddrs := range f.byName {
		delete(f.byName, old)
		for _, a := range oldAddrs {
			f.byAddr[a] = slices.DeleteFunc(f.byAddr[a], func(n string) bool { return n == old })
			if len(f.byAddr[a]) == 0 {
				delete(f.byAddr, a)
			}
		}
		return
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

// ResolveDNS answers a DNS query of type qtype ("A", "AAAA", ...) for name
// (as the query spelled it) that Decide allowed. A: the name's IPv4
// addresses through Lookup, each pinned to the name. AAAA: no addresses (no
// IPv6 egress). ErrNoSuchHost when the name does not exist or has no IPv4
// address, ErrNotAllowed for a name no rule allows, a credential's host
// or another query type;
// any other error is a failure to resolve.
func (f *Filter) ResolveDNS(ctx context.Context, name, qtype string) ([]netip.Addr, error) {
	n, err := NormalizeHost(name)
	if err != nil || f.PinnedName(n) || !f.AllowsName(n) {
		return nil, ErrNotAllowed
	}
	switch qtype {
	case "AAAA":
		return nil, nil
	case "A":
		return f.resolve(ctx, n)
	}
	return nil, ErrNotAllowed
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
