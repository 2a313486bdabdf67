package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"isopod/internal/sandbox"
)

// TestEgressFlags is README's table of the network flags, cell by cell:
// each flag absent, given empty and given, and the combinations that are
// refused. Only the absence of every filter flag means NAT.
func TestEgressFlags(t *testing.T) {
	type outcome struct {
		mode    string
		denyAll bool
		lan     bool
		hosts   []string
		cidrs   []string
	}
	nat := outcome{mode: sandbox.NetworkNAT}
	for _, tt := range []struct {
		flags []string
		want  outcome
	}{
		{nil, nat},
		{[]string{"--no-network"}, outcome{mode: sandbox.NetworkNone}},
		{[]string{"--no-network=false"}, nat},
		{[]string{"--allow-host", "pypi.org"}, outcome{mode: sandbox.NetworkFiltered, hosts: []string{"pypi.org"}}},
		{[]string{"--allow-cidr", "192.0.2.0/24"}, outcome{mode: sandbox.NetworkFiltered, cidrs: []string{"192.0.2.0/24"}}},
		{[]string{"--deny-egress"}, outcome{mode: sandbox.NetworkFiltered, denyAll: true}},
		{[]string{"--deny-egress=false"}, nat},
		{[]string{"--allow-lan-egress"}, outcome{mode: sandbox.NetworkNAT, lan: true}},
		{[]string{"--allow-lan-egress=false"}, nat},
		{[]string{"--allow-lan-egress", "--allow-host", "pypi.org"}, outcome{mode: sandbox.NetworkFiltered, lan: true, hosts: []string{"pypi.org"}}},
		{[]string{"--inject", "gh"}, outcome{mode: sandbox.NetworkFiltered, denyAll: true}},
		{[]string{"--inject", "gh", "--inject", "npm", "--allow-host", "pypi.org"}, outcome{mode: sandbox.NetworkFiltered, hosts: []string{"pypi.org"}}},
		{[]string{"--allow-host", "pypi.org", "--allow-cidr", "192.0.2.0/24"},
			outcome{mode: sandbox.NetworkFiltered, hosts: []string{"pypi.org"}, cidrs: []string{"192.0.2.0/24"}}},
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			var o runOptions
			c := &cobra.Command{Use: "run"}
			runFlags(c, &o)
			if err := c.ParseFlags(tt.flags); err != nil {
				t.Fatal(err)
			}
			if err := o.complete(c, []string{"true"}); err != nil {
				t.Fatal(err)
			}
			r, err := sandbox.Normalize(o.req)
			if err != nil {
				t.Fatal(err)
			}
			got := outcome{mode: r.NetworkMode(), denyAll: r.DenyEgress, lan: r.AllowLANEgress, hosts: r.AllowHosts, cidrs: r.AllowCIDRs}
			if got.mode != tt.want.mode || got.denyAll != tt.want.denyAll || got.lan != tt.want.lan ||
				!slices.Equal(got.hosts, tt.want.hosts) || !slices.Equal(got.cidrs, tt.want.cidrs) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestEgressFlagsRefused: an empty value and every contradictory
// combination is an invalid_argument error naming the flags, before any
// VM starts.
func TestEgressFlagsRefused(t *testing.T) {
	for _, tt := range []struct {
		flags []string
		want  string
	}{
		{[]string{"--no-network="}, "--no-network"},
		{[]string{"--deny-egress="}, "--deny-egress"},
		{[]string{"--allow-lan-egress="}, "--allow-lan-egress"},
		{[]string{"--allow-host", ""}, "--allow-host"},
		{[]string{"--allow-cidr", ""}, "--allow-cidr"},
		{[]string{"--no-network", "--allow-host", "pypi.org"}, "--no-network cannot be combined"},
		{[]string{"--no-network", "--allow-cidr", "192.0.2.0/24"}, "--no-network cannot be combined"},
		{[]string{"--no-network", "--deny-egress"}, "--no-network cannot be combined"},
		{[]string{"--no-network", "--allow-lan-egress"}, "--no-network cannot be combined"},
		{[]string{"--deny-egress", "--allow-host", "pypi.org"}, "--deny-egress cannot be combined"},
		{[]string{"--deny-egress", "--allow-cidr", "192.0.2.0/24"}, "--deny-egress cannot be combined"},
		{[]string{"--inject", "gh", "--no-network"}, "--inject: needs the network"},
		{[]string{"--inject", ""}, "--inject: an alias is empty"},
	} {
		t.Run(strings.Join(tt.flags, " "), func(t *testing.T) {
			args := append(append([]string{"run"}, tt.flags...), "--", "true")
			code, m, _ := runCLI(t, args...)
			msg, _ := m["error"].(string)
			if code != 1 || m["class"] != "invalid_argument" || !strings.Contains(msg, tt.want) {
				t.Errorf("exit %d, %v; want invalid_argument mentioning %q", code, m, tt.want)
			}
		})
	}
}
