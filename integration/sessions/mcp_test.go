package sessions

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
)

// call calls tool and decodes its structured result; a tool error fails
// the test.
func call(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) map[string]any {
	t.Helper()
	res := callRaw(t, cs, tool, args)
	if res.IsError {
		t.Fatalf("%s %v: %s", tool, args, e2e.ToolText(res))
	}
	var out map[string]any
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return out
}

func callRaw(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	return res
}

// startMCPSession starts a no-network base-min session over cs; the
// test's end stops it through the CLI.
func startMCPSession(t *testing.T, cs *mcp.ClientSession, name string, extra ...string) string {
	t.Helper()
	t0 := time.Now()
	args := map[string]any{"base": "base-min", "network": false, "idle_timeout_s": 900}
	if name != "" {
		args["name"] = name
	}
	for i := 0; i+1 < len(extra); i += 2 {
		args[extra[i]] = extra[i+1]
	}
	out := call(t, cs, "session_start", args)
	id, _ := out["session_id"].(string)
	if out["state"] != "running" || !strings.HasPrefix(id, "ss-") {
		t.Fatalf("session_start: %v", out)
	}
	t.Logf("session_start over MCP: %s", time.Since(t0).Round(time.Millisecond))
	rec := readRecord(t, id)
	t.Cleanup(func() {
		e2e.Isopod(t, nil, "session", "stop", id)
		waitGone(t, rec.SupervisorPID, 30*time.Second)
	})
	return id
}

// serveAndFetch is a wget of the guest's httpd on 8000, retried while it
// comes up (bounded).
const serveAndFetch = "for i in $(seq 40); do wget -qO- http://127.0.0.1:8000/index.html && exit 0; sleep 0.25; done; exit 1"

// TestSessionMCPStdio: a session started over MCP on stdio keeps a dev
// server started with background for the next session_exec; write_files
// and read_files round-trip within their caps; the CLI lists it; it
// outlives the MCP server (killed) and a new server execs in it.
func TestSessionMCPStdio(t *testing.T) {
	e2e.RequireVM(t)
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "proj"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "proj", "f"), []byte("from host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, proc := e2e.StartMCPProcess(t, "sessions-e2e", dir, nil, cold...)
	id := startMCPSession(t, cs, "mcpweb", "workspace", "proj")
	if r := call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "pwd; cat f"}); r["stdout"] != "/workspace\nfrom host\n" {
		t.Errorf("the workspace, copied in at start: %v", r)
	}

	r := call(t, cs, "session_exec", map[string]any{"session_id": "mcpweb", "background": true,
		"cmd": "echo hi > /tmp/index.html; exec busybox httpd -f -p 8000 -h /tmp"})
	if job, _ := r["job_id"].(string); job == "" {
		t.Fatalf("background exec: %v", r)
	}
	r = call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": serveAndFetch})
	if r["exit_code"] != float64(0) || r["stdout"] != "hi\n" {
		t.Fatalf("the dev server did not answer the next exec: %v", r)
	}

	// write_files in, read_files back, binary too; over the caps refused.
	bin := []byte{0, 1, 2, 0xff}
	r = call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "cat /tmp/w.txt; cp /tmp/w.txt /tmp/r.txt; stat -c %a /tmp/b.bin",
		"write_files": []any{map[string]any{"path": "/tmp/w.txt", "content": "written\n"},
			map[string]any{"path": "/tmp/b.bin", "content": base64.StdEncoding.EncodeToString(bin), "encoding": "base64", "mode": 0o600}},
		"read_files": []any{"/tmp/r.txt", "/tmp/b.bin"}})
	files, _ := r["files"].([]any)
	if r["stdout"] != "written\n600\n" || len(files) != 2 {
		t.Fatalf("write_files/read_files: %v", r)
	}
	if f := files[0].(map[string]any); f["content"] != "written\n" || f["encoding"] != "utf-8" {
		t.Errorf("read_files[0]: %v", f)
	}
	if f := files[1].(map[string]any); f["content"] != base64.StdEncoding.EncodeToString(bin) || f["encoding"] != "base64" {
		t.Errorf("read_files[1]: %v", f)
	}
	big := strings.Repeat("x", 4<<20+1)
	res := callRaw(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "true",
		"write_files": []any{map[string]any{"path": "/tmp/big", "content": big}}})
	if text := e2e.ToolText(res); !res.IsError || !strings.HasPrefix(text, "session_exec refused: write_files") || len(text) > 2000 {
		t.Errorf("write_files over 4 MiB: %.300s", text)
	}
	// Missing parents are made; a file that cannot be written fails the
	// call before cmd runs.
	r = call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "cat /new/dir/f",
		"write_files": []any{map[string]any{"path": "/new/dir/f", "content": "deep\n"}}})
	if r["stdout"] != "deep\n" {
		t.Errorf("write_files into a new directory: %v", r)
	}
	res = callRaw(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "touch /tmp/ran",
		"write_files": []any{map[string]any{"path": "/tmp", "content": "x"}}})
	if text := e2e.ToolText(res); !res.IsError || !strings.Contains(text, "write_files[0]") || !strings.Contains(text, "cmd did not run") {
		t.Errorf("write_files onto a directory: %s", text)
	}
	if r := call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "test -e /tmp/ran"}); r["exit_code"] != float64(1) {
		t.Errorf("cmd ran after a failed write_files: %v", r)
	}
	many := make([]any, 17)
	for i := range many {
		many[i] = "/etc/hostname"
	}
	res = callRaw(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "true", "read_files": many})
	if text := e2e.ToolText(res); !res.IsError || !strings.HasPrefix(text, "session_exec refused: read_files") {
		t.Errorf("17 read_files: %s", text)
	}

	// Shared with the CLI.
	ls := isopod(t, "session", "ls")
	if !strings.Contains(string(ls.Stdout), id) {
		t.Errorf("isopod session ls does not list %s: %s", id, ls)
	}

	// The server killed, a new one execs in the same session.
	proc.Signal(syscall.SIGKILL)
	cs.Close()
	cs2 := e2e.StartMCP(t, "sessions-e2e-2", "", nil, cold...)
	r = call(t, cs2, "session_exec", map[string]any{"session_id": id, "cmd": serveAndFetch})
	if r["exit_code"] != float64(0) || r["stdout"] != "hi\n" {
		t.Fatalf("after the MCP server's restart: %v", r)
	}
	r = call(t, cs2, "session_stop", map[string]any{"session_id": id})
	if r["state"] != "stopped" {
		t.Errorf("session_stop: %v", r)
	}
}

// Tokens of the HTTP test: two run tokens and an admin.
const (
	tokenA     = "sessions-run-a-0123456789abcdef"
	tokenB     = "sessions-run-b-0123456789abcdef"
	tokenAdmin = "sessions-admin-0123456789abcdef"
)

// TestSessionMCPHTTP: over streamable HTTP a session belongs to the run
// token that started it: another run token gets the not_found a session
// that does not exist gets and does not list it; an admin token lists and
// stops it. session_expose is not offered there.
func TestSessionMCPHTTP(t *testing.T) {
	e2e.RequireVM(t)
	url := e2e.StartMCPHTTP(t, "run "+tokenA+"\nrun "+tokenB+"\nadmin "+tokenAdmin+"\n", cold...)
	a, b, admin := e2e.ConnectHTTP(t, "sessions-e2e-http", url, tokenA), e2e.ConnectHTTP(t, "sessions-e2e-http", url, tokenB), e2e.ConnectHTTP(t, "sessions-e2e-http", url, tokenAdmin)
	tools, err := a.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(tools.Tools, func(tl *mcp.Tool) bool { return tl.Name == "session_expose" }) {
		t.Error("session_expose is offered over HTTP without --allow-session-expose")
	}
	id := startMCPSession(t, a, "owned")
	if r := call(t, a, "session_exec", map[string]any{"session_id": id, "cmd": "echo mine"}); r["stdout"] != "mine\n" {
		t.Fatalf("the owner's exec: %v", r)
	}

	missing := "ss-000000000000"
	for _, ref := range []string{id, "owned"} {
		got := callRaw(t, b, "session_exec", map[string]any{"session_id": ref, "cmd": "true"})
		none := callRaw(t, b, "session_exec", map[string]any{"session_id": missing, "cmd": "true"})
		text := e2e.ToolText(got)
		if !got.IsError || !strings.Contains(text, "(not_found)") ||
			strings.ReplaceAll(text, ref, "REF") != strings.ReplaceAll(e2e.ToolText(none), missing, "REF") {
			t.Errorf("another token's exec of %s: %q; want what a missing session gets: %q", ref, text, e2e.ToolText(none))
		}
	}
	if r := call(t, b, "session_list", nil); strings.Contains(mustJSON(r), id) {
		t.Errorf("another run token lists the session: %v", r)
	}
	if r := call(t, a, "session_list", nil); !strings.Contains(mustJSON(r), id) {
		t.Errorf("the owner does not list its session: %v", r)
	}
	if r := call(t, admin, "session_list", nil); !strings.Contains(mustJSON(r), id) {
		t.Errorf("the admin token does not list the session: %v", r)
	}
	if r := call(t, admin, "session_stop", map[string]any{"session_id": id}); r["state"] != "stopped" {
		t.Errorf("the admin's session_stop: %v", r)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// TestSessionMCPPauseForkCommit: over MCP a paused session outlives its
// server and is resumed by the next server's exec (resumed true); a fork
// runs beside it; a commit makes a stage.
func TestSessionMCPPauseForkCommit(t *testing.T) {
	e2e.RequireVM(t)
	cs, proc := e2e.StartMCPProcess(t, "sessions-e2e-pause", "", nil, cold...)
	outer := t
	id := startMCPSession(t, cs, "")
	call(t, cs, "session_exec", map[string]any{"session_id": id, "background": true,
		"cmd": "echo kept > /tmp/index.html; exec busybox httpd -f -p 8000 -h /tmp"})
	must := func(name string, res *mcp.CallToolResult) {
		t.Helper()
		if res.IsError {
			t.Fatalf("%s: %s", name, e2e.ToolText(res))
		}
	}
	t.Run("pause", func(t *testing.T) {
		res := callRaw(t, cs, "session_pause", map[string]any{"session_id": id})
		must("session_pause", res)
		if st, _ := res.StructuredContent.(map[string]any)["state"]; st != "paused" {
			t.Errorf("session_pause: %s; want state paused", e2e.ToolText(res))
		}
		// The paused session outlives the server: a new one resumes it.
		proc.Signal(syscall.SIGKILL)
		cs.Close()
		cs = e2e.StartMCP(outer, "sessions-e2e-pause-2", "", nil, cold...)
		r := call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": serveAndFetch})
		if r["resumed"] != true || r["stdout"] != "kept\n" {
			t.Errorf("the exec after a pause and a new server: %v", r)
		}
	})
	t.Run("fork", func(t *testing.T) {
		res := callRaw(t, cs, "session_fork", map[string]any{"session_id": id})
		must("session_fork", res)
		var child map[string]any
		raw, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(raw, &child)
		cid, _ := child["session_id"].(string)
		t.Cleanup(func() { e2e.Isopod(t, nil, "session", "stop", cid) })
		if r := call(t, cs, "session_exec", map[string]any{"session_id": cid, "cmd": serveAndFetch}); r["stdout"] != "kept\n" {
			t.Errorf("the fork's server: %v", r)
		}
		call(t, cs, "session_stop", map[string]any{"session_id": cid})
	})
	t.Run("commit", func(t *testing.T) {
		call(t, cs, "session_exec", map[string]any{"session_id": id, "cmd": "echo committed > /root/mark"})
		res := callRaw(t, cs, "session_commit", map[string]any{"session_id": id, "label": "mcpsess/mark"})
		must("session_commit", res)
		r := call(t, cs, "sandbox_run", map[string]any{"cmd": "cat /root/mark", "stage": "mcpsess/mark", "network": false})
		if r["stdout"] != "committed\n" {
			t.Errorf("a run on the committed stage: %v", r)
		}
	})
}
