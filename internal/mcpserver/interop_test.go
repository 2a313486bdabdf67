package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/internal/knobs"
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

// interopOutput is what test/mcp-interop/client.mjs prints.
type interopOutput struct {
	Server struct{ Name, Version string }
	Tools  []struct {
		Name            string
		Required        []string
		Properties      []string
		Types           map[string]any
		HasOutputSchema bool
	}
	Results []interopResult
}

// interopResult is what one step gave.
type interopResult struct {
	// A tool call's result.
	Name       string
	IsError    bool
	Text       string
	Structured map[string]any
	// A raw line's answer.
	Raw   string
	Reply map[string]any
	// The signal step's outcome.
	Signal    string
	LiveVM    string
	ExitMS    *float64
	ExitCode  *float64
	ServerPid int
	Call      struct {
		Error   string
		Code    float64
		Pending bool
	}
}

func call(name string, args map[string]any) map[string]any {
	return map[string]any{"name": name, "arguments": args}
}

// TestTypeScriptClientInterop drives the server with the official
// TypeScript SDK's client (test/mcp-interop; run npm ci there first). On a
// host with a built base it also runs VMs: a run with Inspector-style
// arguments, vm_list and vm_gc after it, and a SIGTERM in the middle of a
// run, after which the server must be gone within 5 s and leave no QEMU.
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
	outside := map[string]any{"guest": "/etc/hostname", "host": "../outside/x"}
	steps := []map[string]any{
		call(ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": []any{outside}}),
		call(ToolSandboxRun, map[string]any{"cmd": "true", "timeout_s": 0}),
		call(ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": []any{map[string]any{"guest": "/a"}}}),
		call(ToolVMGC, map[string]any{"keep_last": "many"}),
		{"raw": `{"jsonrpc":"2.0","id":"broken","method":`},
		{"raw": `[{"jsonrpc":"2.0","id":"b1","method":"ping"}]`},
		{"raw": `{"jsonrpc":"1.0","id":"old","method":"ping"}`},
		call(ToolStageList, map[string]any{}),
		call(ToolSandboxRun, map[string]any{"cmd": "true", "network": "false", "allow_hosts": "[]"}),
		call(ToolSandboxRun, map[string]any{"cmd": "true", "network": "false", "allow_cidrs": `["192.0.2.0/24"]`}),
		call(ToolSandboxRun, map[string]any{"cmd": "true", "copy_out": string(mustJSON([]any{outside}))}),
	}
	var base string
	if !testing.Short() {
		base, _ = findVMBase()
	}
	if base != "" {
		steps = append(steps,
			call(ToolSandboxRun, map[string]any{"cmd": "echo hi", "base": base, "network": "false", "copy_out": "[]"}),
			// The VM's teardown goes on for a moment after the result: the
			// VMM was sent SIGKILL, and its record is finished once it has
			// been reaped.
			map[string]any{"wait_ms": 1000},
			call(ToolVMList, map[string]any{}),
			call(ToolVMGC, map[string]any{"keep_last": 0}),
			map[string]any{"signal": "SIGTERM", "name": ToolSandboxRun,
				"arguments": map[string]any{"cmd": "sleep 600", "base": base, "network": false, "timeout_s": 900}})
	} else {
		// No VM: the server's runs last until they are cancelled.
		steps = append(steps, map[string]any{"signal": "SIGTERM", "on_progress": true, "name": ToolSandboxRun,
			"arguments": map[string]any{"cmd": "sleep 600"}})
	}
	out := runInterop(t, node, dir, h, steps, base == "")
	checkInteropBasics(t, out)
	r := out.Results
	if len(r) != len(steps) {
		t.Fatalf("%d results for %d steps", len(r), len(steps))
	}
	wantText := []string{
		0:  knobs.MCPHostIORoot,
		1:  "sandbox_run refused: timeout_s: must be between 1 and 3600 (got 0)",
		2:  "sandbox_run refused: copy_out[0].host: required, but not given",
		3:  `vm_gc refused: keep_last: must be a whole number (got "many")`,
		8:  "sandbox_run refused: network: false removes the network card, so allow_hosts and allow_cidrs cannot apply",
		9:  "sandbox_run refused: network: false removes the network card",
		10: knobs.MCPHostIORoot,
	}
	for i, want := range wantText {
		if want != "" && (!r[i].IsError || !strings.Contains(r[i].Text, want)) {
			t.Errorf("step %d: error %v, %q; want an error saying %q", i, r[i].IsError, r[i].Text, want)
		}
	}
	for i, code := range map[int]float64{4: -32700, 5: -32600, 6: -32600} {
		e, _ := r[i].Reply["error"].(map[string]any)
		if e["code"] != code {
			t.Errorf("raw line %q: answered %v; want error code %v", r[i].Raw, r[i].Reply, code)
		}
	}
	if r[7].IsError || r[7].Structured["stages"] == nil {
		t.Errorf("stage_list after the malformed lines: %+v", r[7])
	}
	if base != "" {
		checkInteropVMs(t, out, 11)
	} else {
		checkSignal(t, out.Results[11])
	}
}

// runInterop runs client.mjs over steps and parses what it prints.
func runInterop(t *testing.T, node, dir string, h hostTree, steps []map[string]any, privateHome bool) *interopOutput {
	t.Helper()
	stepsJSON, _ := json.Marshal(steps)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "client.mjs"), serverBin, string(stepsJSON))
	cmd.Dir = h.Root
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	if privateHome {
		// No VMs here: keep the server's state in the fixture, and hold
		// its runs.
		cmd.Env = append(cmd.Env, knobs.Home+"="+h.Home, holdEnv+"=1")
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node client: %v\nstderr:\n%s", err, stderr.String())
	}
	out := new(interopOutput)
	if err := json.Unmarshal(stdout.Bytes(), out); err != nil {
		t.Fatalf("client output %q: %v\nstderr:\n%s", stdout.String(), err, stderr.String())
	}
	if t.Failed() {
		t.Logf("stderr:\n%s", stderr.String())
	}
	return out
}

// checkInteropBasics checks the server's identity and tools as the
// TypeScript client sees them.
func checkInteropBasics(t *testing.T, out *interopOutput) {
	t.Helper()
	if out.Server.Name != "isopod" || out.Server.Version != "test" {
		t.Errorf("server %+v; want isopod, version test (what the test server is given)", out.Server)
	}
	var names []string
	for _, tl := range out.Tools {
		names = append(names, tl.Name)
		if tl.Name != ToolSandboxRun {
			continue
		}
		if !slices.Equal(tl.Required, []string{"cmd"}) || !slices.Contains(tl.Properties, "copy_out") || !tl.HasOutputSchema {
			t.Errorf("sandbox_run as the TypeScript client sees it: %+v", tl)
		}
		for p, typ := range map[string]string{"network": "boolean", "allow_hosts": "array", "allow_cidrs": "array", "copy_out": "array"} {
			if tl.Types[p] != typ {
				t.Errorf("sandbox_run %s has type %v; want %q", p, tl.Types[p], typ)
			}
		}
	}
	slices.Sort(names)
	want := slices.Clone(ToolNames)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Errorf("tools %v, want %v", names, want)
	}
}

// checkInteropVMs checks the VM steps, from index i: a run, a pause,
// vm_list, vm_gc and the SIGTERM.
func checkInteropVMs(t *testing.T, out *interopOutput, i int) {
	t.Helper()
	run, list, gc, sig := out.Results[i], out.Results[i+2], out.Results[i+3], out.Results[i+4]
	if run.IsError || run.Structured["stdout"] != "hi\n" || run.Structured["vm_name"] == nil || run.Structured["duration_ms"] == nil {
		t.Fatalf("a run with network \"false\" and copy_out \"[]\": %+v", run)
	}
	if _, ok := run.Structured["ok"]; ok {
		t.Errorf("the run result carries ok: %v", run.Structured)
	}
	id := run.Structured["vm_id"]
	found := false
	for _, v := range list.Structured["vms"].([]any) {
		vm := v.(map[string]any)
		if vm["vm_id"] == id {
			found = true
			if vm["live"] != false {
				t.Errorf("vm_list after the run ended: %v; want live false", vm)
			}
		}
	}
	if !found {
		t.Errorf("vm_list does not list %v: %v", id, list.Structured)
	}
	if removed, _ := gc.Structured["removed"].([]any); !slices.Contains(removed, id) {
		t.Errorf("vm_gc keep_last 0 kept the finished %v: %v", id, gc.Structured)
	}
	if sig.LiveVM == "" {
		t.Fatal("no live VM showed in vm_list before the signal")
	}
	checkSignal(t, sig)
	if left := qemuOf(sig.LiveVM); len(left) > 0 {
		t.Errorf("QEMU %v of %s still runs after the server exited", left, sig.LiveVM)
	}
}

// checkSignal checks the signal step: the server exited within 5 s of
// SIGTERM, and answered the call in flight with a JSON-RPC error saying it
// is shutting down.
func checkSignal(t *testing.T, sig interopResult) {
	t.Helper()
	if sig.ExitMS != nil {
		t.Logf("the server exited %.0f ms after SIGTERM", *sig.ExitMS)
	}
	if sig.ExitMS == nil || *sig.ExitMS > 5000 {
		t.Errorf("the server exited %v ms after SIGTERM; want within 5000", sig.ExitMS)
	}
	if c := sig.Call; c.Code != codeShuttingDown || !strings.Contains(c.Error, "shutting down") {
		t.Errorf("the call in flight at SIGTERM got %+v; want a JSON-RPC error saying the server is shutting down", c)
	}
}

// qemuOf lists the running (not zombie) QEMU processes whose command line
// names vmID.
func qemuOf(vmID string) []int {
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		stat, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if !bytes.Contains(cmdline, []byte("qemu-system")) || !bytes.Contains(cmdline, []byte(vmID)) {
			continue
		}
		if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && stat[i+2] == 'Z' {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}
