package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
)

// scriptedCore stands in for the VM-backed core where a test needs to
// control timing or failures the real core cannot produce on demand. It
// records what the server asked for.
type scriptedCore struct {
	mu     sync.Mutex
	reqs   []sandbox.Request
	stdins []string
	run    func(ctx context.Context, req sandbox.Request) (*sandbox.Report, error)
	images *sandbox.ImageListResult
	gcs    atomic.Int32
	keep   atomic.Int32
	refs   []string
}

func (c *scriptedCore) Run(ctx context.Context, req sandbox.Request) (*sandbox.Report, error) {
	var in string
	if req.Stdin != nil {
		b, _ := io.ReadAll(req.Stdin)
		in = string(b)
	}
	c.mu.Lock()
	c.reqs = append(c.reqs, req)
	c.stdins = append(c.stdins, in)
	run := c.run
	c.mu.Unlock()
	if run == nil {
		code := 0
		return &sandbox.Report{OK: true, VMID: "vm-test", ExitCode: &code, Stdout: "hi\n", Path: "cold"}, nil
	}
	return run(ctx, req)
}

func (c *scriptedCore) requests() []sandbox.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.reqs)
}

func (c *scriptedCore) StageList(context.Context) (*sandbox.StageListResult, error) {
	return &sandbox.StageListResult{OK: true, Stages: []sandbox.StageEntry{}}, nil
}

func (c *scriptedCore) StageInfo(_ context.Context, ref string) (*sandbox.StageInfoResult, error) {
	c.mu.Lock()
	c.refs = append(c.refs, ref)
	c.mu.Unlock()
	return nil, fmt.Errorf("stage %q: %w", ref, errdefs.ErrNotFound)
}

func (c *scriptedCore) StageRemove(_ context.Context, ref string) (*sandbox.StageRemoveResult, error) {
	return &sandbox.StageRemoveResult{OK: true, Removed: "abc", Label: ref}, nil
}

func (c *scriptedCore) VMList(context.Context) (*sandbox.VMListResult, error) {
	return &sandbox.VMListResult{OK: true, VMs: []sandbox.VMEntry{}}, nil
}

func (c *scriptedCore) VMGC(_ context.Context, keep int) (*sandbox.VMGCResult, error) {
	c.gcs.Add(1)
	c.keep.Store(int32(keep))
	return &sandbox.VMGCResult{OK: true, Removed: []string{}, KilledVMMs: []int{}}, nil
}

func (c *scriptedCore) ImageList(context.Context) (*sandbox.ImageListResult, error) {
	if c.images == nil {
		return nil, errdefs.ErrNotSupported
	}
	return c.images, nil
}

// session is a client connected in memory to a Server.
type session struct {
	cs       *mcp.ClientSession
	srv      *Server
	progress chan *mcp.ProgressNotificationParams
}

func connect(t *testing.T, cfg Config) *session {
	t.Helper()
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &session{srv: srv, progress: make(chan *mcp.ProgressNotificationParams, 1000)}
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			s.progress <- r.Params
		},
	})
	ct, st := mcp.NewInMemoryTransports()
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- srv.Run(ctx, st) }()
	cs, err := client.Connect(context.Background(), ct, nil)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	s.cs = cs
	t.Cleanup(func() {
		cs.Close()
		cancel()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Error("server did not stop")
		}
	})
	return s
}

func (s *session) call(t *testing.T, ctx context.Context, name string, args any, token any) *mcp.CallToolResult {
	t.Helper()
	p := &mcp.CallToolParams{Name: name, Arguments: args}
	if token != nil {
		p.SetProgressToken(token)
	}
	res, err := s.cs.CallTool(ctx, p)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

func resultText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

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
	run := tools[ToolSandboxRun].InputSchema.(map[string]any)["properties"].(map[string]any)
	for _, p := range []string{"cmd", "stage", "base", "network", "allow_hosts", "allow_cidrs", "commit_as", "timeout_s",
		"vcpus", "mem_mib", "scratch_mib", "env", "cwd", "stdin", "stdin_file", "copy_out"} {
		if run[p] == nil {
			t.Errorf("sandbox_run lacks %s", p)
		}
	}
	if d := run["network"].(map[string]any)["default"]; d != true {
		t.Errorf("network default = %v, want true", d)
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
	if ins := s.cs.InitializeResult().Instructions; ins == "" || len(ins) >= 2048 {
		t.Errorf("instructions are %d bytes, want 1..2047", len(ins))
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
			want := sandbox.Request{Argv: []string{"/bin/sh", "-c", "echo hi"}, Stage: "base", Base: DefaultBase}
			r.Stdin = nil
			// Schema defaults fill in the documented values; they equal the
			// core's own defaults.
			want.TimeoutS, want.VCPUs, want.MemMiB = sandbox.DefaultTimeoutS, sandbox.DefaultVCPUs, sandbox.DefaultMemMiB
			if !reflect.DeepEqual(r, want) {
				t.Errorf("request = %+v, want %+v", r, want)
			}
		}},
		{"fork keeps the chain's base", map[string]any{"cmd": "true", "stage": "proj/deps"}, func(t *testing.T, r sandbox.Request) {
			if r.Stage != "proj/deps" || r.Base != "" {
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
			if !r.DenyEgress || r.NoNetwork || r.AllowHosts == nil || len(r.AllowHosts) != 0 {
				t.Errorf("request DenyEgress=%v NoNetwork=%v AllowHosts=%#v", r.DenyEgress, r.NoNetwork, r.AllowHosts)
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
			want := []sandbox.CopyOut{{Guest: "/out/a", Host: filepath.Join(h.root, "sub", "a.txt")}}
			if !slices.Equal(r.CopyOut, want) {
				t.Errorf("copy_out %+v, want %+v", r.CopyOut, want)
			}
		}},
		{"copy_out creates missing parents under the root", map[string]any{"cmd": "true", "copy_out": []map[string]string{{"guest": "/o", "host": "made/here/o.txt"}}}, func(t *testing.T, r sandbox.Request) {
			want := filepath.Join(h.root, "made", "here", "o.txt")
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
	for _, r := range core.requests() {
		if r.StdinFile != "" {
			t.Errorf("StdinFile %q passed to the core; the server reads it", r.StdinFile)
		}
	}
}

func TestRunReportAndGuestFailure(t *testing.T) {
	code := 3
	core := &scriptedCore{run: func(context.Context, sandbox.Request) (*sandbox.Report, error) {
		return &sandbox.Report{OK: true, VMID: "vm-1", ExitCode: &code, Stderr: "boom\n", Path: "cold", RootfsFlavor: "base-debian"}, nil
	}}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "exit 3"}, nil)
	if res.IsError {
		t.Fatalf("a guest's non-zero exit became a tool error: %s", resultText(res))
	}
	var rep sandbox.Report
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

func TestToolErrorsNameTheFix(t *testing.T) {
	tests := []struct {
		name   string
		err    error
		images *sandbox.ImageListResult
		args   map[string]any
		want   []string
	}{
		{"unbuilt base carries its build hint", fmt.Errorf("base base-debian: %w", errdefs.ErrFailedPrecondition),
			&sandbox.ImageListResult{OK: true, Images: []sandbox.ImageEntry{
				{Flavor: "base-min", Built: true},
				{Flavor: "base-debian", Hint: "isopod image build base-debian"},
			}}, map[string]any{"cmd": "true"},
			[]string{"failed_precondition", "base base-debian is not built", "isopod image build base-debian"}},
		{"stale base", fmt.Errorf("stale: %w", errdefs.ErrFailedPrecondition),
			&sandbox.ImageListResult{OK: true, Images: []sandbox.ImageEntry{
				{Flavor: "base-min", Built: true, Stale: true, StaleReason: "agent", Hint: "isopod image build base-min"},
			}}, map[string]any{"cmd": "true", "base": "base-min"},
			[]string{"is stale (agent)", "isopod image build base-min"}},
		{"without an image list, a generic fix", fmt.Errorf("kernel missing: %w", errdefs.ErrFailedPrecondition),
			nil, map[string]any{"cmd": "true"}, []string{"kernel missing", "image_list shows"}},
		{"label taken", fmt.Errorf("label proj/x: %w", errdefs.ErrAlreadyExists),
			nil, map[string]any{"cmd": "true", "commit_as": "proj/x"}, []string{"already_exists", "choose another commit_as label"}},
		{"unclassified", errors.New("disk full"), nil, map[string]any{"cmd": "true"}, []string{"internal", "disk full", "Fix:"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			core := &scriptedCore{images: tc.images, run: func(context.Context, sandbox.Request) (*sandbox.Report, error) {
				return nil, tc.err
			}}
			s := connect(t, Config{Core: core, NoStartupGC: true})
			res := s.call(t, context.Background(), ToolSandboxRun, tc.args, nil)
			if !res.IsError {
				t.Fatal("an isopod failure was not a tool error")
			}
			for _, w := range tc.want {
				if !strings.Contains(resultText(res), w) {
					t.Errorf("error %q lacks %q", resultText(res), w)
				}
			}
		})
	}
}

func TestRefusalsNeverReachTheCore(t *testing.T) {
	h := newHostTree(t)
	tests := []struct {
		name   string
		policy func(HostIO) HostIO
		args   map[string]any
		want   []string
	}{
		{"copy_out escape", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "../outside/secret.txt"}}},
			[]string{h.root, knobs.MCPHostIORoot}},
		{"copy_out through a symlink out", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "out-link"}}},
			[]string{h.root, knobs.MCPHostIORoot}},
		{"copy_out dangling link/", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "dangling/"}}},
			[]string{"does not resolve"}},
		{"copy_out into the state dir", nil, map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": ".isopod/credentials.json"}}},
			[]string{"state directory"}},
		{"copy_out switched off", func(p HostIO) HostIO { p.CopyOut = false; return p },
			map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "fine.txt"}}},
			[]string{knobs.MCPCopyOut + "=off"}},
		{"stdin_file outside", nil, map[string]any{"stdin_file": h.secret}, []string{h.root, knobs.MCPHostIORoot}},
		{"stdin_file FIFO", nil, map[string]any{"stdin_file": "fifo"}, []string{"a FIFO"}},
		{"stdin_file 5 MiB", nil, map[string]any{"stdin_file": "big"}, []string{"4 MiB"}},
		{"stdin and stdin_file", nil, map[string]any{"stdin_file": "ok.txt", "stdin": "x"}, []string{"give one"}},
		{"filters without a network", nil, map[string]any{"network": false, "allow_hosts": []string{}}, []string{"network=false"}},
		{"bad env name", nil, map[string]any{"env": map[string]string{"A=B": "c"}}, []string{"env name"}},
		{"empty cmd", nil, map[string]any{"cmd": " "}, []string{"cmd is empty"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := h.policy()
			if tc.policy != nil {
				p = tc.policy(p)
			}
			core := &scriptedCore{}
			s := connect(t, Config{Core: core, HostIO: p, NoStartupGC: true})
			args := map[string]any{"cmd": "cat /etc/hostname"}
			for k, v := range tc.args {
				args[k] = v
			}
			before := snapshotDir(t, h.base)
			res := s.call(t, context.Background(), ToolSandboxRun, args, nil)
			sameSnapshot(t, before, snapshotDir(t, h.base))
			if !res.IsError {
				t.Fatalf("accepted: %s", resultText(res))
			}
			if n := len(core.requests()); n != 0 {
				t.Errorf("the core saw %d runs", n)
			}
			for _, w := range append(tc.want, "sandbox_run refused") {
				if !strings.Contains(resultText(res), w) {
					t.Errorf("error %q lacks %q", resultText(res), w)
				}
			}
		})
	}
}

func TestSchemaRejectsBadInput(t *testing.T) {
	core := &scriptedCore{}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	for _, args := range []map[string]any{
		{},
		{"cmd": "true", "bogus": 1},
		{"cmd": "true", "timeout_s": sandbox.MaxTimeoutS + 1},
		{"cmd": "true", "mem_mib": 1},
		{"cmd": "true", "network": "yes"},
	} {
		if res := s.call(t, context.Background(), ToolSandboxRun, args, nil); !res.IsError {
			t.Errorf("%v accepted", args)
		}
	}
	if n := len(core.requests()); n != 0 {
		t.Errorf("the core saw %d runs", n)
	}
}

func TestProgressKeepalive(t *testing.T) {
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*sandbox.Report, error) {
		select {
		case <-time.After(600 * time.Millisecond):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		code := 0
		return &sandbox.Report{ExitCode: &code}, nil
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
	// None after the result, and none without a token.
	if res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "sleep 1"}, nil); res.IsError {
		t.Fatal(resultText(res))
	}
	time.Sleep(100 * time.Millisecond)
	if n := len(s.progress); n != 0 {
		t.Errorf("%d progress notifications without a token or after the result", n)
	}
}

func TestCancellationReachesTheCore(t *testing.T) {
	started := make(chan struct{})
	ended := make(chan error, 1)
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*sandbox.Report, error) {
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
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*sandbox.Report, error) {
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
	if res := s.call(t, ctx, ToolVMGC, map[string]any{"keep_last": -1}, nil); !res.IsError {
		t.Error("vm_gc accepted a negative keep_last")
	}
	for _, name := range []string{ToolStageList, ToolVMList} {
		if res := s.call(t, ctx, name, map[string]any{}, nil); res.IsError {
			t.Errorf("%s: %s", name, resultText(res))
		}
	}
	if res := s.call(t, ctx, ToolStageRm, map[string]any{"reference": "proj/x"}, nil); res.IsError || !strings.Contains(resultText(res), `"removed":"abc"`) {
		t.Errorf("stage_rm: %s", resultText(res))
	}
	if res := s.call(t, ctx, ToolImageList, map[string]any{}, nil); !res.IsError || !strings.Contains(resultText(res), "not_supported") {
		t.Errorf("image_list failure: %s", resultText(res))
	}
}

func TestMain(m *testing.M) {
	if os.Getenv(serveEnv) == "1" {
		os.Exit(serveForTest())
	}
	// The servers these tests start, and the VM tests' settings, use a
	// private state root, never the user's.
	os.Exit(e2e.PrivateHome(m))
}
