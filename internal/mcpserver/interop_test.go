package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"isopod/internal/knobs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// interopDir finds test/mcp-interop from the package directory.
func interopDir(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for d := wd; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "test", "mcp-interop")
		}
	}
	t.Fatal("no go.mod above the package directory")
	return ""
}

// TestTypeScriptClientInterop drives the server with the official
// TypeScript SDK's client (test/mcp-interop; run npm ci there first).
func TestTypeScriptClientInterop(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	dir := interopDir(t)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("the TypeScript SDK is not installed; run npm ci in %s", dir)
	}
	h := newHostTree(t)
	calls := []map[string]any{
		// Refused by confinement before any VM: works on every host.
		{"name": ToolSandboxRun, "arguments": map[string]any{"cmd": "true",
			"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "../outside/x"}}}},
	}
	var base string
	if !testing.Short() {
		base, _ = findVMBase()
	}
	if base != "" {
		calls = append(calls, map[string]any{"name": ToolSandboxRun,
			"arguments": map[string]any{"cmd": "echo hi", "base": base, "network": false}})
	}
	callsJSON, _ := json.Marshal(calls)

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"), os.Args[0], string(callsJSON))
	cmd.Dir = h.root
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	if base == "" {
		// No VMs here: keep the server's state in the fixture.
		cmd.Env = append(cmd.Env, knobs.Home+"="+h.home)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client: %v\nstderr:\n%s", err, stderr.String())
	}
	var out struct {
		Server struct{ Name string }
		Tools  []struct {
			Name            string
			Required        []string
			Properties      []string
			HasOutputSchema bool
		}
		Results []struct {
			Name       string
			IsError    bool
			Text       string
			Structured map[string]any
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("client output %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
	if out.Server.Name != "isopod" {
		t.Errorf("server name %q", out.Server.Name)
	}
	var names []string
	for _, tl := range out.Tools {
		names = append(names, tl.Name)
		if tl.Name == ToolSandboxRun {
			if !slices.Equal(tl.Required, []string{"cmd"}) || !slices.Contains(tl.Properties, "copy_out") || !tl.HasOutputSchema {
				t.Errorf("sandbox_run as the TypeScript client sees it: %+v", tl)
			}
		}
	}
	slices.Sort(names)
	want := slices.Clone(ToolNames)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
	if len(out.Results) != len(calls) {
		t.Fatalf("%d results for %d calls", len(out.Results), len(calls))
	}
	if r := out.Results[0]; !r.IsError || !strings.Contains(r.Text, knobs.MCPHostIORoot) {
		t.Errorf("confinement refusal as the TypeScript client sees it: %+v", r)
	}
	if base != "" {
		r := out.Results[1]
		if r.IsError || r.Structured["stdout"] != "hi\n" || r.Structured["exit_code"] != float64(0) {
			t.Errorf("echo as the TypeScript client sees it: %+v", r)
		}
	}
}
