package mcpserver

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/hostio"
	"isopod/internal/settings"
)

// maxReply is the most a reply may take whatever the size of what the
// call sent.
const maxReply = 4 << 10

// hugeCall is one call with a huge value somewhere in it.
type hugeCall struct {
	what string
	tool string
	args map[string]any
}

// hugeCalls puts v in each string argument of each tool, and in each
// place a string stands for something else: an argument's name, another
// type's value, the tool's name.
func hugeCalls(v string) []hugeCall {
	run := func(what string, set map[string]any) hugeCall {
		args := map[string]any{"cmd": "true", "base": "base-min", "network": false, "cwd": "/"}
		maps.Copy(args, set)
		return hugeCall{what, ToolSandboxRun, args}
	}
	calls := []hugeCall{
		run("cmd", map[string]any{"cmd": v}),
		run("stage", map[string]any{"stage": v}),
		run("base", map[string]any{"base": v}),
		run("commit_as", map[string]any{"commit_as": v}),
		run("cwd", map[string]any{"cwd": v}),
		run("stdin", map[string]any{"stdin": v}),
		run("stdin_file", map[string]any{"stdin_file": v}),
		run("workspace", map[string]any{"workspace": v}),
		run("workspace_out", map[string]any{"workspace": ".", "workspace_out": v}),
		run("env name", map[string]any{"env": map[string]any{v: "1"}}),
		run("env value", map[string]any{"env": map[string]any{"X": v}}),
		run("allow_hosts", map[string]any{"network": true, "allow_hosts": []any{v}}),
		run("allow_cidrs", map[string]any{"network": true, "allow_cidrs": []any{v}}),
		run("copy_out guest", map[string]any{"copy_out": []any{map[string]any{"guest": v, "host": "x"}}}),
		run("copy_out host", map[string]any{"copy_out": []any{map[string]any{"guest": "/etc/hostname", "host": v}}}),
		run("read_files", map[string]any{"read_files": []any{v}}),
		run("an argument's name", map[string]any{v: 1}),
		run("copy_out field's name", map[string]any{"copy_out": []any{map[string]any{"guest": "/a", "host": "x", v: 1}}}),
	}
	for _, name := range []string{"network", "timeout_s", "vcpus", "mem_mib", "scratch_mib", "workspace_all", "allow_hosts", "copy_out", "read_files", "env"} {
		calls = append(calls, run(name+" as text", map[string]any{name: v}))
	}
	for _, tool := range []string{ToolStageInfo, ToolStageRm} {
		calls = append(calls, hugeCall{tool + " reference", tool, map[string]any{"reference": v}})
	}
	calls = append(calls, hugeCall{"vm_gc keep_last", ToolVMGC, map[string]any{"keep_last": v}})
	start := func(what string, set map[string]any) hugeCall {
		args := map[string]any{"base": "base-min", "network": false}
		maps.Copy(args, set)
		return hugeCall{"session_start " + what, ToolSessionStart, args}
	}
	exec := func(what string, set map[string]any) hugeCall {
		args := map[string]any{"session_id": "ss-000000000000", "cmd": "true"}
		maps.Copy(args, set)
		return hugeCall{"session_exec " + what, ToolSessionExec, args}
	}
	calls = append(calls,
		start("name", map[string]any{"name": v}), start("stage", map[string]any{"stage": v}),
		start("idle_action", map[string]any{"idle_action": v}), start("cwd", map[string]any{"cwd": v}),
		start("workspace", map[string]any{"workspace": v}),
		exec("session_id", map[string]any{"session_id": v}), exec("cmd", map[string]any{"cmd": v}),
		exec("cwd", map[string]any{"cwd": v}), exec("read_files", map[string]any{"read_files": []any{v}}),
		exec("write_files path", map[string]any{"write_files": []any{map[string]any{"path": v, "content": "x"}}}),
		exec("write_files encoding", map[string]any{"write_files": []any{map[string]any{"path": "/x", "content": "x", "encoding": v}}}),
		exec("write_files content", map[string]any{"write_files": []any{map[string]any{"path": "/x", "content": v, "encoding": "base64"}}}),
		hugeCall{"session_job job_id", ToolSessionJob, map[string]any{"session_id": "x", "job_id": v}},
		hugeCall{"session_fork name", ToolSessionFork, map[string]any{"session_id": "x", "name": v}},
		hugeCall{"session_commit label", ToolSessionCommit, map[string]any{"session_id": "x", "label": v}},
	)
	for _, tool := range []string{ToolSessionStop, ToolSessionPause, ToolSessionResume} {
		calls = append(calls, hugeCall{tool + " session_id", tool, map[string]any{"session_id": v}})
	}
	for _, tool := range ToolNames {
		calls = append(calls, hugeCall{tool + " unknown argument", tool, map[string]any{v: v}})
	}
	return append(calls, hugeCall{"the tool's name", v, map[string]any{}})
}

// TestHugeValuesAreNotEchoed: whatever string a call makes huge, the reply
// quotes at most a short head of it, in a reply of a few KiB at most, on
// the real core (its own checks and messages) over HTTP.
func TestHugeValuesAreNotEchoed(t *testing.T) {
	t.Parallel()
	core, drv := newFakeCore(t)
	tree := newHostTree(t)
	hostIO, _ := hostio.Remote(settings.HostIO{StdinFile: true, CopyOut: true, Workspace: true}, tree.Root, tree.Home)
	sessions, _ := testSessions(t, core.CheckVM)
	h := startHTTP(t, Config{Core: core, HostIO: hostIO, ProgressInterval: time.Hour, Sessions: sessions}, nil)
	tp := &tap{next: http.DefaultTransport}
	s, err := connectHTTPAs(t, h.url, adminToken, tp, "2025-11-25", 0)
	if err != nil {
		t.Fatal(err)
	}
	values := map[string]string{
		"256 KiB word":   strings.Repeat("x", 256<<10),
		"64 KiB of text": strings.Repeat("ab c\"d ", 64<<10/7),
	}
	for vname, v := range values {
		for _, c := range hugeCalls(v) {
			before := len(tp.all())
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
			cancel()
			var reply int
			for _, ex := range tp.all()[before:] {
				<-ex.done
				if ex.call {
					reply = max(reply, len(ex.body.String()))
				}
			}
			what := fmt.Sprintf("%s in %s", vname, c.what)
			switch {
			case reply == 0:
				t.Errorf("%s: no reply seen (%v)", what, err)
			case reply > maxReply:
				got := fmt.Sprint(err)
				if res != nil {
					got = resultText(res)
				}
				t.Errorf("%s: a reply of %d bytes: %.300s", what, reply, got)
			}
		}
	}
	// A reference of 8 MiB, as sent in the field.
	res := s.call(t, context.Background(), ToolStageInfo, map[string]any{"reference": strings.Repeat("r", 8<<20)}, nil)
	if n := len(resultText(res)); !res.IsError || n > maxReply {
		t.Errorf("stage_info of an 8 MiB reference: error %v, %d bytes", res.IsError, n)
	}
	if !waitFor(10*time.Second, func() bool { return liveMachines(drv) == 0 }) {
		t.Errorf("%d machines still run", liveMachines(drv))
	}
}

// TestHugeRequestsAreRefused: a request body over the limit gets 413, and
// a huge method name an answer that quotes only its head.
func TestHugeRequestsAreRefused(t *testing.T) {
	t.Parallel()
	h := startHTTP(t, Config{Core: &scriptedCore{}}, nil)
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"true","stdin":"` +
		strings.Repeat("x", maxBody) + `"}}}`
	resp := post(t, h.url, runToken, "2025-11-25", body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body of %d bytes: HTTP %d; want 413", len(body), resp.StatusCode)
	}
	for _, body := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"` + strings.Repeat("m", 1<<20) + `"}`,
		`{"jsonrpc":"2.0","method":"notifications/` + strings.Repeat("m", 1<<20) + `"}`,
	} {
		resp := post(t, h.url, runToken, "2025-11-25", body)
		b := new(strings.Builder)
		n, _ := fmt.Fprint(b, readAll(resp))
		if n > maxReply {
			t.Errorf("a 1 MiB method name: HTTP %d, a reply of %d bytes", resp.StatusCode, n)
		}
	}
}

func readAll(resp *http.Response) string {
	defer resp.Body.Close()
	var b strings.Builder
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		b.Write(buf[:n])
		if err != nil {
			return b.String()
		}
	}
}
