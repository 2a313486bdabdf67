package sandbox

import (
	"errors"
	"strings"
	"testing"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
)

// TestNormalizeInject: credentials imply filtered egress (nothing else
// allowed unless a list allows it, a list's rules kept) and are refused
// without a network, before anything starts.
func TestNormalizeInject(t *testing.T) {
	host := admission.Host{CPUs: 8, MemTotalMiB: 16384}
	for _, tt := range []struct {
		name    string
		req     Request
		mode    string
		denyAll bool
		hosts   []string
	}{
		{"alone", Request{Inject: []string{"gh"}}, NetworkFiltered, true, nil},
		{"with a host", Request{Inject: []string{"gh"}, AllowHosts: []string{"pypi.org"}}, NetworkFiltered, false, []string{"pypi.org"}},
		{"with deny-egress", Request{Inject: []string{"gh"}, DenyEgress: true}, NetworkFiltered, true, nil},
		{"with a cidr", Request{Inject: []string{"gh"}, AllowCIDRs: []string{"192.0.2.0/24"}}, NetworkFiltered, false, nil},
		{"none", Request{Inject: []string{}}, NetworkNAT, false, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := tt.req
			r.Argv = []string{"true"}
			if got := r.NetworkMode(); got != tt.mode {
				t.Errorf("NetworkMode %s; want %s", got, tt.mode)
			}
			n, err := normalize(r, host)
			if err != nil {
				t.Fatal(err)
			}
			if n.NetworkMode() != tt.mode || string(n.rules.Mode()) != tt.mode || n.DenyEgress != tt.denyAll {
				t.Errorf("normalised: mode %s rules %s deny %v; want %s deny %v", n.NetworkMode(), n.rules.Mode(), n.DenyEgress, tt.mode, tt.denyAll)
			}
			if hs := n.rules.Strings(); len(tt.hosts) > 0 && !strings.Contains(strings.Join(hs, ","), tt.hosts[0]) {
				t.Errorf("rules %v; want %v kept", hs, tt.hosts)
			}
		})
	}
	_, err := normalize(Request{Argv: []string{"true"}, Inject: []string{"gh"}, NoNetwork: true}, host)
	var ae *errdefs.ArgError
	if !errors.As(err, &ae) || ae.Field != "inject" || !errors.Is(err, errdefs.ErrInvalidArgument) ||
		!strings.Contains(err.Error(), "--inject: needs the network") || !strings.Contains(err.Error(), "drop --no-network") {
		t.Errorf("inject without a network: %v; want an invalid-argument refusal naming --inject and the fix", err)
	}
}
