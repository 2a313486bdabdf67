package mcpserver

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"isopod/internal/credential"
	"isopod/internal/sandbox"
)

// TestRunInject: inject reaches the core as the aliases a model named
// (the core resolves them for the Model caller), as an array or as the
// text of one; it makes the run filtered, with nothing else allowed unless
// a list allows it; network=false with it is refused before the core.
func TestRunInject(t *testing.T) {
	for _, tt := range []struct {
		args    string
		aliases []string
		mode    string
		hosts   []string
		refused string
	}{
		{args: `{"inject": ["gh"]}`, aliases: []string{"gh"}, mode: sandbox.NetworkFiltered},
		{args: `{"inject": "[\"gh\", \"npm\"]"}`, aliases: []string{"gh", "npm"}, mode: sandbox.NetworkFiltered},
		{args: `{"inject": ["gh"], "allow_hosts": ["pypi.org"]}`, aliases: []string{"gh"}, mode: sandbox.NetworkFiltered, hosts: []string{"pypi.org"}},
		{args: `{"inject": ["gh"], "network": true}`, aliases: []string{"gh"}, mode: sandbox.NetworkFiltered},
		{args: `{"inject": []}`, mode: sandbox.NetworkNAT},
		{args: `{"inject": ["gh"], "network": false}`, refused: "sandbox_run refused: inject: needs the network"},
	} {
		t.Run(tt.args, func(t *testing.T) {
			var m map[string]json.RawMessage
			if err := json.Unmarshal([]byte(tt.args), &m); err != nil {
				t.Fatal(err)
			}
			m["cmd"] = json.RawMessage(`"true"`)
			core := &scriptedCore{}
			s := connect(t, Config{Core: core, NoStartupGC: true})
			res := s.call(t, context.Background(), ToolSandboxRun, m, nil)
			if tt.refused != "" {
				if !res.IsError || !strings.Contains(resultText(res), tt.refused) || len(core.requests()) != 0 {
					t.Errorf("got %q (core saw %d runs); want a refusal containing %q", resultText(res), len(core.requests()), tt.refused)
				}
				return
			}
			if res.IsError {
				t.Fatalf("refused: %s", resultText(res))
			}
			reqs := core.requests()
			if len(reqs) != 1 {
				t.Fatalf("the core saw %d runs", len(reqs))
			}
			r := reqs[0]
			if !slices.Equal(r.Inject, tt.aliases) || r.Caller != credential.Model {
				t.Errorf("inject %q caller %v; want %q named by the model", r.Inject, r.Caller, tt.aliases)
			}
			n := normalized(t, r)
			if n.NetworkMode() != tt.mode || !slices.Equal(n.AllowHosts, tt.hosts) {
				t.Errorf("network %s hosts %q; want %s %q", n.NetworkMode(), n.AllowHosts, tt.mode, tt.hosts)
			}
			if tt.hosts == nil && tt.mode == sandbox.NetworkFiltered && !n.DenyEgress {
				t.Error("inject alone must allow nothing else")
			}
		})
	}
}
