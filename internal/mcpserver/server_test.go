package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/credential"
	"isopod/internal/report"
	"isopod/internal/sandbox"
)

func TestListTools(t *testing.T) {
	s := connect(t, Config{Core: &scriptedCore{}, NoStartupGC: true})
	res, err := s.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	var names []string
	for _, tl := range res.Tools {
		tools[tl.Name] = tl
		names = append(names, tl.Name)
	}
	slices.Sort(names)
	want := slices.Clone(ToolNames)
	slices.Sort(want)
	if !slices.Equal(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}
	required := map[string][]string{
		ToolSandboxRun: {"cmd"},
		ToolStageInfo:  {"reference"},
		ToolStageRm:    {"reference"},
		ToolStageList:  nil,
		ToolVMList:     nil,
		ToolVMGC:       nil,
		ToolImageList:  nil,

		ToolSessionStart: nil, ToolSessionExec: {"session_id", "cmd"}, ToolSessionJob: {"session_id", "job_id"},
		ToolSessionExpose: {"session_id", "guest_port"}, ToolSessionPause: {"session_id"}, ToolSessionResume: {"session_id"},
		ToolSessionFork: {"session_id"}, ToolSessionCommit: {"session_id", "label"}, ToolSessionStop: {"session_id"},
		ToolSessionList: nil,
	}
	for name, req := range required {
		tl := tools[name]
		if tl.Description == "" {
			t.Errorf("%s has no description", name)
		}
		sc := tl.InputSchema.(map[string]any)
		var got []string
		if r, ok := sc["required"].([]any); ok {
			for _, x := range r {
				got = append(got, x.(string))
			}
		}
		if !slices.Equal(got, req) {
			t.Errorf("%s required = %v, want %v", name, got, req)
		}
		props, _ := sc["properties"].(map[string]any)
		for pn := range props {
			// ISOPOD_ALLOW_BASE_SKEW comes from the server's environment only.
			if strings.Contains(strings.ToLower(pn), "skew") {
				t.Errorf("%s has an argument %q: base skew must not be settable by a tool call", name, pn)
			}
		}
		for pn, pv := range props {
			if d, _ := pv.(map[string]any)["description"].(string); len(d) < 15 {
				t.Errorf("%s.%s has no useful description (%q)", name, pn, d)
			}
		}
		if tl.OutputSchema == nil {
			t.Errorf("%s has no output schema", name)
		}
	}
	if ins := s.cs.InitializeResult().Instructions; ins == "" || len(ins) >= 2048 {
		t.Errorf("instructions are %d bytes, want 1..2047", len(ins))
	} else if !strings.Contains(ins, "session_start") || !strings.Contains(ins, "session_stop every session when done") {
		t.Errorf("the instructions do not say when to use a session and to stop it: %s", ins)
	}
}

func TestRunArgsMapping(t *testing.T) {
	h := newHostTree(t)
	tests := []struct {
		name  string
		args  map[string]any
		check func(t *testing.T, r sandbox.Request)
	}{
		{"defaults", map[string]any{"cmd": "echo hi"}, func(t *testing.T, r sandbox.Request) {
			// The defaults are the core's to apply; the server only says
			// which base it prefers.
			want := sandbox.Request{Argv: []string{"/bin/sh", "-c", "echo hi"}, Shell: true, DefaultBase: DefaultBase, Caller: credential.Model}
			r.Stdin = nil
			if !reflect.DeepEqual(r, want) {
				t.Errorf("request = %+v, want %+v", r, want)
			}
		}},
		{"fork keeps the chain's base", map[string]any{"cmd": "true", "stage": "proj/deps"}, func(t *testing.T, r sandbox.Request) {
			if r.Stage != "proj/deps" || r.Base != "" || r.DefaultBase != DefaultBase {
				t.Errorf("stage %q base %q", r.Stage, r.Base)
			}
		}},
		{"explicit base", map[string]any{"cmd": "true", "base": "base-min"}, func(t *testing.T, r sandbox.Request) {
			if r.Base != "base-min" {
				t.Errorf("base %q", r.Base)
			}
		}},
		{"network off", map[string]any{"cmd": "true", "network": false}, func(t *testing.T, r sandbox.Request) {
			if !r.NoNetwork || r.DenyEgress || r.AllowHosts != nil {
				t.Errorf("request %+v", r)
			}
		}},
		{"empty allow_hosts denies and records", map[string]any{"cmd": "true", "allow_hosts": []string{}}, func(t *testing.T, r sandbox.Request) {
			n := normalized(t, r)
			if !n.DenyEgress || n.NetworkMode() != sandbox.NetworkFiltered || r.AllowHosts == nil || len(r.AllowHosts) != 0 {
				t.Errorf("request DenyEgress=%v mode=%s AllowHosts=%#v", n.DenyEgress, n.NetworkMode(), r.AllowHosts)
			}
		}},
		{"empty allow_hosts with allow_cidrs allows those networks", map[string]any{"cmd": "true", "allow_hosts": []string{}, "allow_cidrs": []string{"192.0.2.0/24"}}, func(t *testing.T, r sandbox.Request) {
			if n := normalized(t, r); n.DenyEgress || len(n.AllowCIDRs) != 1 || n.NetworkMode() != sandbox.NetworkFiltered {
				t.Errorf("request DenyEgress=%v AllowCIDRs=%v; want the networks allowed, not deny-all", n.DenyEgress, n.AllowCIDRs)
			}
		}},
		{"allow_hosts filters", map[string]any{"cmd": "true", "allow_hosts": []string{"pypi.org"}, "allow_cidrs": []string{"10.0.0.0/8"}}, func(t *testing.T, r sandbox.Request) {
			if r.DenyEgress || !slices.Equal(r.AllowHosts, []string{"pypi.org"}) || !slices.Equal(r.AllowCIDRs, []string{"10.0.0.0/8"}) {
				t.Errorf("request %+v", r)
			}
		}},
		{"sizes, env, cwd, commit", map[string]any{"cmd": "true", "vcpus": 2, "mem_mib": 1024, "scratch_mib": 2048, "timeout_s": 30,
			"env": map[string]string{"B": "2", "A": "1=x"}, "cwd": "/tmp", "commit_as": "proj/deps"}, func(t *testing.T, r sandbox.Request) {
			if r.VCPUs != 2 || r.MemMiB != 1024 || r.ScratchMiB != 2048 || r.TimeoutS != 30 || r.Cwd != "/tmp" || r.CommitAs != "proj/deps" {
				t.Errorf("request %+v", r)
			}
			if !slices.Equal(r.Env, []string{"A=1=x", "B=2"}) {
				t.Errorf("env %q", r.Env)
			}
		}},
		{"copy_out is resolved", map[string]any{"cmd": "true", "copy_out": []map[string]string{{"guest": "/out/a", "host": "sub/./a.txt/"}}}, func(t *testing.T, r sandbox.Request) {
			want := filepath.Join(h.Root, "sub", "a.txt")
			if len(r.CopyOut) != 1 || r.CopyOut[0].Guest != "/out/a" || r.CopyOut[0].Host != want {
				t.Errorf("copy_out %+v, want /out/a to %s", r.CopyOut, want)
			}
			if len(r.CopyOut) == 1 && r.CopyOut[0].HostDir == nil {
				t.Error("copy_out reaches the core without its directory's descriptor")
			}
		}},
		{"copy_out creates missing parents under the root", map[string]any{"cmd": "true", "copy_out": []map[string]string{{"guest": "/o", "host": "made/here/o.txt"}}}, func(t *testing.T, r sandbox.Request) {
			want := filepath.Join(h.Root, "made", "here", "o.txt")
			if len(r.CopyOut) != 1 || r.CopyOut[0].Host != want {
				t.Errorf("copy_out %+v", r.CopyOut)
			}
			if fi, err := os.Stat(filepath.Dir(want)); err != nil || !fi.IsDir() {
				t.Errorf("parent not created: %v", err)
			}
			if _, err := os.Stat(want); err == nil {
				t.Error("the destination itself was created before the run")
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core := &scriptedCore{}
			s := connect(t, Config{Core: core, HostIO: h.policy(), NoStartupGC: true})
			res := s.call(t, context.Background(), ToolSandboxRun, tc.args, nil)
			if res.IsError {
				t.Fatalf("tool error: %s", resultText(res))
			}
			reqs := core.requests()
			if len(reqs) != 1 {
				t.Fatalf("core saw %d runs", len(reqs))
			}
			tc.check(t, reqs[0])
		})
	}
}

func TestRunStdin(t *testing.T) {
	h := newHostTree(t)
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, HostIO: h.policy(), NoStartupGC: true})
	for _, args := range []map[string]any{
		{"cmd": "cat", "stdin": "inline\n"},
		{"cmd": "cat", "stdin_file": "ok.txt"},
	} {
		if res := s.call(t, context.Background(), ToolSandboxRun, args, nil); res.IsError {
			t.Fatalf("%v: %s", args, resultText(res))
		}
	}
	if !slices.Equal(core.stdins, []string{"inline\n", "hello from the host\n"}) {
		t.Errorf("stdins = %q", core.stdins)
	}
}

func TestRunReportAndGuestFailure(t *testing.T) {
	code := 3
	core := &scriptedCore{run: func(context.Context, sandbox.Request) (*report.Run, error) {
		return &report.Run{OK: true, VMID: "vm-1", Outcome: report.Outcome{ExitCode: &code, Stderr: "boom\n"}, Path: "cold", RootfsFlavor: "base-debian"}, nil
	}}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "exit 3"}, nil)
	if res.IsError {
		t.Fatalf("a guest's non-zero exit became a tool error: %s", resultText(res))
	}
	var rep report.Run
	raw, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.ExitCode == nil || *rep.ExitCode != 3 || rep.Stderr != "boom\n" || rep.VMID != "vm-1" {
		t.Errorf("structured report = %s", raw)
	}
	var fromText map[string]any
	if err := json.Unmarshal([]byte(resultText(res)), &fromText); err != nil || fromText["exit_code"] != float64(3) {
		t.Errorf("text content is not the report JSON: %v %q", err, resultText(res))
	}
}

func TestProgressKeepalive(t *testing.T) {
	t.Parallel()
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		select {
		case <-time.After(600 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}}, nil
	}}
	s := connect(t, Config{Core: core, ProgressInterval: 50 * time.Millisecond, NoStartupGC: true})

	if res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "sleep 1"}, "tok-1"); res.IsError {
		t.Fatal(resultText(res))
	}
	var got []*mcp.ProgressNotificationParams
	for len(s.progress) > 0 {
		got = append(got, <-s.progress)
	}
	// 600 ms at 50 ms: about 12; allow a slow machine plenty of slack.
	if len(got) < 4 {
		t.Fatalf("got %d progress notifications in 600 ms at a 50 ms interval", len(got))
	}
	for i, p := range got {
		if p.ProgressToken != "tok-1" {
			t.Errorf("token %v", p.ProgressToken)
		}
		if i > 0 && p.Progress <= got[i-1].Progress {
			t.Errorf("progress did not increase: %v then %v", got[i-1].Progress, p.Progress)
		}
	}
	// None after the result, and none without a token: the server's own
	// writes show the order (the client may hand a notification to its
	// handler after the result).
	sent, next := s.wire.since(0)
	last := -1
	for i, m := range sent {
		if m.Method == "notifications/progress" {
			last = i
		}
	}
	var resultAt int
	for i, m := range sent {
		if m.Result != nil && len(m.ID) > 0 {
			resultAt = i
		}
	}
	if last < 0 || last > resultAt {
		t.Errorf("progress notification at wire position %d, the call's result at %d", last, resultAt)
	}
	if res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "sleep 1"}, nil); res.IsError {
		t.Fatal(resultText(res))
	}
	sent, _ = s.wire.since(next)
	for _, m := range sent {
		if m.Method == "notifications/progress" {
			t.Errorf("progress notification (token %v) for a call without a token or after its result", m.Params.ProgressToken)
		}
	}
}

func TestCancellationReachesTheCore(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		<-started
		cancel()
	}()
	_, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{"cmd": "sleep 600"}})
	if err == nil {
		t.Error("a cancelled call returned a result")
	}
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("core context ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the core's context was not cancelled")
	}
}

func TestCloseEndsRunsInFlight(t *testing.T) {
	started := make(chan struct{})
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		close(started)
		<-ctx.Done()
		return nil, ctx.Err()
	}}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	go s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{"cmd": "sleep 600"}})
	<-started
	done := make(chan struct{})
	go func() { s.srv.Close(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not end the run in flight")
	}
}

func TestPeriodicGC(t *testing.T) {
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, GCEvery: 3})
	waitFor := func(n int32) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for core.gcs.Load() != n {
			if time.Now().After(deadline) {
				t.Fatalf("%d GCs, want %d", core.gcs.Load(), n)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	waitFor(1) // at start-up
	if k := core.keep.Load(); k != DefaultGCKeepLast {
		t.Errorf("GC keep_last = %d", k)
	}
	for i := 1; i <= 7; i++ {
		s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true"}, nil)
		switch i {
		case 3:
			waitFor(2)
		case 6:
			waitFor(3)
		}
	}
	time.Sleep(50 * time.Millisecond)
	waitFor(3)
}

func TestHousekeepingTools(t *testing.T) {
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	ctx := context.Background()

	res := s.call(t, ctx, ToolStageInfo, map[string]any{"reference": "proj/none"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), "not_found") || !strings.Contains(resultText(res), "stage_list") {
		t.Errorf("stage_info of a missing stage: %s", resultText(res))
	}
	if !slices.Equal(core.refs, []string{"proj/none"}) {
		t.Errorf("refs %q", core.refs)
	}
	if res := s.call(t, ctx, ToolVMGC, map[string]any{"keep_last": 5}, nil); res.IsError || core.keep.Load() != 5 {
		t.Errorf("vm_gc keep_last 5: %s (keep %d)", resultText(res), core.keep.Load())
	}
	if res := s.call(t, ctx, ToolVMGC, map[string]any{}, nil); res.IsError || core.keep.Load() != DefaultGCKeepLast {
		t.Errorf("vm_gc default: %s (keep %d)", resultText(res), core.keep.Load())
	}
	if res := s.call(t, ctx, ToolVMGC, map[string]any{"keep_last": 0}, nil); res.IsError || core.keep.Load() != 0 {
		t.Errorf("vm_gc keep_last 0: %s (keep %d); want 0 to mean 0", resultText(res), core.keep.Load())
	}
	if res := s.call(t, ctx, ToolVMGC, map[string]any{"keep_last": -1}, nil); !res.IsError {
		t.Error("vm_gc accepted a negative keep_last")
	}
	for _, name := range []string{ToolStageList, ToolVMList} {
		if res := s.call(t, ctx, name, map[string]any{}, nil); res.IsError {
			t.Errorf("%s: %s", name, resultText(res))
		}
	}
	if res := s.call(t, ctx, ToolStageRm, map[string]any{"reference": "proj/x"}, nil); res.IsError || !strings.HasPrefix(resultText(res), `{"removed":"abc"`) {
		t.Errorf("stage_rm: %s", resultText(res))
	}
	if res := s.call(t, ctx, ToolImageList, map[string]any{}, nil); !res.IsError || !strings.Contains(resultText(res), "not_supported") {
		t.Errorf("image_list failure: %s", resultText(res))
	}
}
