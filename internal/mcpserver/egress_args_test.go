package mcpserver

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"isopod/internal/sandbox"
)

// normalized is r as the core runs it.
func normalized(t *testing.T, r sandbox.Request) sandbox.Request {
	t.Helper()
	n, err := sandbox.Normalize(r)
	if err != nil {
		t.Fatalf("the core refuses %+v: %v", r, err)
	}
	return n
}

// egressOutcome is what one combination of sandbox_run's network
// arguments gives: the network, and for a filtered run whether it denies
// everything and which rules it has; or the refusal.
type egressOutcome struct {
	mode    string
	denyAll bool
	hosts   []string
	cidrs   []string
	refused string // a substring of the tool error; "" when the call runs
}

var (
	natRun     = egressOutcome{mode: sandbox.NetworkNAT}
	noNIC      = egressOutcome{mode: sandbox.NetworkNone}
	denyAllRun = egressOutcome{mode: sandbox.NetworkFiltered, denyAll: true}
)

// TestEgressSwitches is docs/mcp-usage.md's table of the network
// arguments, cell by cell: each switch absent, null, empty (as JSON and as
// the text a form-based client sends) and given, and the combinations
// that are refused. Only absence of both lists (null is absence) means
// NAT; a list given at all, even [], means filtered.
func TestEgressSwitches(t *testing.T) {
	cidr := []string{"192.0.2.0/24"}
	host := []string{"pypi.org"}
	unknown := egressOutcome{refused: "allow_lan_egress: unknown"}
	netFalse := egressOutcome{refused: "network: false removes the network card"}
	for _, tt := range []struct {
		args string // sandbox_run's arguments besides cmd
		want egressOutcome
	}{
		{`{}`, natRun},

		{`{"network": null}`, natRun},
		{`{"network": ""}`, natRun},
		{`{"network": true}`, natRun},
		{`{"network": "true"}`, natRun},
		{`{"network": false}`, noNIC},
		{`{"network": "false"}`, noNIC},

		{`{"allow_hosts": null}`, natRun},
		{`{"allow_hosts": ""}`, natRun},
		{`{"allow_hosts": "null"}`, natRun},
		{`{"allow_hosts": []}`, denyAllRun},
		{`{"allow_hosts": "[]"}`, denyAllRun},
		{`{"allow_hosts": ["pypi.org"]}`, egressOutcome{mode: sandbox.NetworkFiltered, hosts: host}},

		{`{"allow_cidrs": null}`, natRun},
		{`{"allow_cidrs": ""}`, natRun},
		{`{"allow_cidrs": "null"}`, natRun},
		{`{"allow_cidrs": []}`, denyAllRun},
		{`{"allow_cidrs": "[]"}`, denyAllRun},
		{`{"allow_cidrs": ["192.0.2.0/24"]}`, egressOutcome{mode: sandbox.NetworkFiltered, cidrs: cidr}},

		// MCP has no allow_lan_egress: private ranges are reached by
		// naming them in allow_cidrs.
		{`{"allow_lan_egress": null}`, natRun},
		{`{"allow_lan_egress": true}`, unknown},
		{`{"allow_lan_egress": false}`, unknown},

		{`{"allow_hosts": [], "allow_cidrs": []}`, denyAllRun},
		{`{"allow_hosts": [], "allow_cidrs": ["192.0.2.0/24"]}`, egressOutcome{mode: sandbox.NetworkFiltered, cidrs: cidr}},
		{`{"allow_hosts": ["pypi.org"], "allow_cidrs": []}`, egressOutcome{mode: sandbox.NetworkFiltered, hosts: host}},
		{`{"allow_hosts": null, "allow_cidrs": []}`, denyAllRun},
		{`{"network": true, "allow_cidrs": []}`, denyAllRun},
		{`{"network": true, "allow_hosts": ["pypi.org"]}`, egressOutcome{mode: sandbox.NetworkFiltered, hosts: host}},
		{`{"network": false, "allow_hosts": null, "allow_cidrs": null}`, noNIC},
		{`{"network": false, "allow_hosts": []}`, netFalse},
		{`{"network": false, "allow_cidrs": []}`, netFalse},
		{`{"network": false, "allow_cidrs": ["192.0.2.0/24"]}`, netFalse},
		{`{"network": "false", "allow_hosts": "[]"}`, netFalse},
	} {
		t.Run(tt.args, func(t *testing.T) {
			got := callEgress(t, tt.args)
			if !egressEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

// callEgress makes one sandbox_run call with args (and cmd) and says what
// the core was asked for, normalised as it runs it, or why it was refused.
func callEgress(t *testing.T, args string) egressOutcome {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal([]byte(args), &m); err != nil {
		t.Fatal(err)
	}
	m["cmd"] = json.RawMessage(`"true"`)
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSandboxRun, m, nil)
	if res.IsError {
		if !strings.HasPrefix(resultText(res), "sandbox_run refused: ") {
			t.Errorf("not a refusal: %s", resultText(res))
		}
		return egressOutcome{refused: resultText(res)}
	}
	reqs := core.requests()
	if len(reqs) != 1 {
		t.Fatalf("the core saw %d runs", len(reqs))
	}
	n := normalized(t, reqs[0])
	return egressOutcome{mode: n.NetworkMode(), denyAll: n.DenyEgress, hosts: n.AllowHosts, cidrs: n.AllowCIDRs}
}

func egressEqual(got, want egressOutcome) bool {
	if want.refused != "" || got.refused != "" {
		return want.refused != "" && strings.Contains(got.refused, want.refused)
	}
	return got.mode == want.mode && got.denyAll == want.denyAll &&
		slices.Equal(got.hosts, want.hosts) && slices.Equal(got.cidrs, want.cidrs)
}
