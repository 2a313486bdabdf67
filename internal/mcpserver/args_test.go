package mcpserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/sandbox"
)

// TestSchemaRefusalsInOurWords: a schema violation names the argument,
// what is wanted and what was given, in words and not Go values.
func TestSchemaRefusalsInOurWords(t *testing.T) {
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	huge := strings.Repeat("A", 8<<20)
	for _, tt := range []struct {
		tool string
		args map[string]any
		want string
	}{
		{ToolSandboxRun, map[string]any{"cmd": "true", "timeout_s": 0}, "sandbox_run refused: timeout_s: must be between 1 and 3600 (got 0)"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "mem_mib": 1}, "sandbox_run refused: mem_mib: must be between 128 and 4096 (got 1)"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "vcpus": 1.5}, "sandbox_run refused: vcpus: must be a whole number (got 1.5)"},
		{ToolSandboxRun, map[string]any{}, "sandbox_run refused: cmd: required, but not given"},
		{ToolSandboxRun, map[string]any{"cmd": 3}, "sandbox_run refused: cmd: must be a string (got 3)"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "bogus": 1}, "sandbox_run refused: bogus: unknown; the arguments are cmd, stage, base, network"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "network": "yes"}, `sandbox_run refused: network: must be true or false (got "yes")`},
		{ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": []any{map[string]any{"guest": "/a", "host": "b", "mode": 1}}},
			"sandbox_run refused: copy_out[0].mode: unknown; the fields are guest, host"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": []any{map[string]any{"guest": "/a"}}},
			"sandbox_run refused: copy_out[0].host: required, but not given"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": []any{"/a:b"}}, `sandbox_run refused: copy_out[0]: must be an object (got "/a:b")`},
		{ToolSandboxRun, map[string]any{"cmd": "true", "env": map[string]any{"A": 1}}, "sandbox_run refused: env.A: must be a string (got 1)"},
		{ToolSandboxRun, map[string]any{"cmd": "true", "allow_hosts": "pypi.org"}, `sandbox_run refused: allow_hosts: must be an array (got "pypi.org")`},
		{ToolSandboxRun, map[string]any{"cmd": "true", "network": huge}, `sandbox_run refused: network: must be true or false (got "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"... (8388608 bytes))`},
		{ToolVMGC, map[string]any{"keep_last": -1}, "vm_gc refused: keep_last: must be at least 0 (got -1)"},
		{ToolStageInfo, map[string]any{}, "stage_info refused: reference: required, but not given"},
		{ToolStageList, map[string]any{"x": 1}, "stage_list refused: x: unknown; it takes no arguments"},
	} {
		res := s.call(t, context.Background(), tt.tool, tt.args, nil)
		if got := resultText(res); !res.IsError || !strings.HasPrefix(got, tt.want) {
			t.Errorf("%s %v:\n got %q\nwant %q", tt.tool, short(tt.args), trim(got), tt.want)
		}
		if len(resultText(res)) > 1000 {
			t.Errorf("%s: a %d-byte error echoes the arguments", tt.tool, len(resultText(res)))
		}
	}
	if n := len(core.requests()); n != 0 {
		t.Errorf("the core saw %d runs", n)
	}
}

func trim(s string) string {
	if len(s) > 300 {
		return s[:300] + "..."
	}
	return s
}

func short(args map[string]any) string { return trim(string(mustJSON(args))) }

// TestInspectorStyleArguments: text for sandbox_run's boolean and array
// arguments is read as the value it spells.
func TestInspectorStyleArguments(t *testing.T) {
	for _, tt := range []struct {
		name  string
		args  map[string]any
		check func(sandbox.Request) bool
	}{
		{"network false", map[string]any{"network": "false"}, func(r sandbox.Request) bool { return r.NoNetwork }},
		{"network TRUE", map[string]any{"network": " TRUE "}, func(r sandbox.Request) bool { return !r.NoNetwork }},
		{"network empty", map[string]any{"network": ""}, func(r sandbox.Request) bool { return !r.NoNetwork }},
		{"allow_hosts []", map[string]any{"allow_hosts": "[]"}, func(r sandbox.Request) bool {
			return r.AllowHosts != nil && r.NetworkMode() == sandbox.NetworkFiltered
		}},
		{"allow_hosts list", map[string]any{"allow_hosts": `["pypi.org", "*.pythonhosted.org"]`},
			func(r sandbox.Request) bool { return len(r.AllowHosts) == 2 && r.AllowHosts[1] == "*.pythonhosted.org" }},
		{"allow_hosts empty text", map[string]any{"allow_hosts": ""}, func(r sandbox.Request) bool {
			return r.AllowHosts == nil && r.NetworkMode() == sandbox.NetworkNAT
		}},
		{"allow_cidrs list", map[string]any{"allow_cidrs": `["192.0.2.0/24"]`}, func(r sandbox.Request) bool { return len(r.AllowCIDRs) == 1 }},
		{"copy_out []", map[string]any{"copy_out": "[]"}, func(r sandbox.Request) bool { return len(r.CopyOut) == 0 }},
		{"copy_out list", map[string]any{"copy_out": `[{"guest": "/o", "host": "o.txt"}]`},
			func(r sandbox.Request) bool { return len(r.CopyOut) == 1 && r.CopyOut[0].Guest == "/o" }},
		{"nulls are absent", map[string]any{"network": nil, "allow_hosts": nil, "copy_out": nil},
			func(r sandbox.Request) bool { return !r.NoNetwork && r.AllowHosts == nil && len(r.CopyOut) == 0 }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHostTree(t)
			core := &scriptedCore{}
			s := connect(t, Config{Core: core, HostIO: h.policy(), NoStartupGC: true})
			args := map[string]any{"cmd": "true"}
			for k, v := range tt.args {
				args[k] = v
			}
			res := s.call(t, context.Background(), ToolSandboxRun, args, nil)
			if res.IsError {
				t.Fatalf("refused: %s", resultText(res))
			}
			reqs := core.requests()
			if len(reqs) != 1 || !tt.check(reqs[0]) {
				t.Errorf("request %+v", reqs)
			}
		})
	}
}

// TestCheckerAgreesWithJSONSchema holds checkArgs to the jsonschema
// package's verdict on the same inputs, so that the two never disagree on
// what the published schema allows.
func TestCheckerAgreesWithJSONSchema(t *testing.T) {
	schemas := map[string]*jsonschema.Schema{
		ToolSandboxRun: runInputSchema(),
		ToolStageInfo:  inputSchema[StageRefArgs](),
		ToolStageList:  inputSchema[NoArgs](),
	}
	inputs := []struct {
		tool string
		args string
	}{
		{ToolSandboxRun, `{"cmd":"x"}`},
		{ToolSandboxRun, `{}`},
		{ToolSandboxRun, `{"cmd":"x","timeout_s":0}`},
		{ToolSandboxRun, `{"cmd":"x","timeout_s":3600}`},
		{ToolSandboxRun, `{"cmd":"x","timeout_s":3601}`},
		{ToolSandboxRun, `{"cmd":"x","vcpus":2.0}`},
		{ToolSandboxRun, `{"cmd":"x","vcpus":2.5}`},
		{ToolSandboxRun, `{"cmd":"x","network":false}`},
		{ToolSandboxRun, `{"cmd":"x","network":"false"}`},
		{ToolSandboxRun, `{"cmd":"x","allow_hosts":[]}`},
		{ToolSandboxRun, `{"cmd":"x","allow_hosts":[1]}`},
		{ToolSandboxRun, `{"cmd":"x","copy_out":[{"guest":"/a","host":"b"}]}`},
		{ToolSandboxRun, `{"cmd":"x","copy_out":[{"guest":"/a"}]}`},
		{ToolSandboxRun, `{"cmd":"x","copy_out":[{"guest":"/a","host":"b","x":1}]}`},
		{ToolSandboxRun, `{"cmd":"x","env":{"A":"1"}}`},
		{ToolSandboxRun, `{"cmd":"x","env":{"A":1}}`},
		{ToolSandboxRun, `{"cmd":"x","env":[]}`},
		{ToolSandboxRun, `{"cmd":"x","extra":true}`},
		{ToolSandboxRun, `{"cmd":"x","scratch_mib":127}`},
		{ToolStageInfo, `{"reference":"a"}`},
		{ToolStageInfo, `{"reference":null}`},
		{ToolStageInfo, `{}`},
		{ToolStageList, `{}`},
		{ToolStageList, `{"a":1}`},
	}
	for _, in := range inputs {
		sc := schemas[in.tool]
		resolved, err := sc.Resolve(nil)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		json.Unmarshal([]byte(in.args), &v)
		theirs := resolved.Validate(v)
		_, ours := checkArgs(sc, json.RawMessage(in.args), nil)
		if (theirs == nil) != (ours == nil) {
			t.Errorf("%s %s: jsonschema says %v; checkArgs says %v", in.tool, in.args, theirs, ours)
		}
	}
}

// TestRunSchema: sandbox_run's published schema carries its defaults and
// bounds, and plain types.
func TestRunSchema(t *testing.T) {
	s := connect(t, Config{Core: &scriptedCore{}, HostIO: newHostTree(t).policy(), NoStartupGC: true})
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
	}
	run := tools[ToolSandboxRun].InputSchema.(map[string]any)["properties"].(map[string]any)
	for _, p := range []string{"cmd", "stage", "base", "network", "allow_hosts", "allow_cidrs", "commit_as", "timeout_s",
		"vcpus", "mem_mib", "scratch_mib", "env", "cwd", "stdin", "stdin_file", "copy_out", "inject"} {
		if run[p] == nil {
			t.Errorf("sandbox_run lacks %s", p)
		}
	}
	if d := run["network"].(map[string]any)["default"]; d != true {
		t.Errorf("network default = %v, want true", d)
	}
	// Plain types: a nullable ["null", ...] type makes form-based clients
	// send text.
	for name, typ := range map[string]string{"network": "boolean", "allow_hosts": "array", "allow_cidrs": "array", "copy_out": "array", "env": "object", "inject": "array"} {
		if got := run[name].(map[string]any)["type"]; got != typ {
			t.Errorf("%s type = %v; want %q", name, got, typ)
		}
	}
	for _, name := range []string{"allow_hosts", "allow_cidrs"} {
		if d, ok := run[name].(map[string]any)["default"]; ok {
			t.Errorf("%s has a default (%v); absent and [] differ", name, d)
		}
	}
	if d, ok := run["copy_out"].(map[string]any)["default"].([]any); !ok || len(d) != 0 {
		t.Errorf("copy_out default = %v; want []", run["copy_out"].(map[string]any)["default"])
	}
	if _, ok := run["base"].(map[string]any)["default"]; ok {
		t.Error("base carries a schema default, which would override a forked stage's base")
	}
	if mx := run["timeout_s"].(map[string]any)["maximum"]; mx != float64(sandbox.MaxTimeoutS) {
		t.Errorf("timeout_s maximum = %v", mx)
	}
	if got := tools[ToolSandboxRun].Meta["anthropic/maxResultSizeChars"]; got != float64(100000) {
		t.Errorf("sandbox_run _meta max result size = %v", got)
	}
}
