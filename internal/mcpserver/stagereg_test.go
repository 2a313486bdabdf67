package mcpserver

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/transfer"
)

// transferCore is a core whose stages live in a map and that pulls and
// pushes through a fake registry (a map of tags), counting pulls.
type transferCore struct {
	scriptedCore
	repo string

	mu       sync.Mutex        // guards following
	stages   map[string]string // label or id -> id, on this host
	registry map[string]string // tag -> id
	pushed   []string

	pulls    atomic.Int32
	pushFail error
	// gate, when set, holds every pull until it is closed.
	gate chan struct{}
	// stageInfoHook, when set, runs after each StageInfo answer is made.
	stageInfoHook func()
}

func newTransferCore(repo string) *transferCore {
	return &transferCore{repo: repo, stages: map[string]string{}, registry: map[string]string{}}
}

func (c *transferCore) StageInfo(_ context.Context, ref string) (*stages.StageInfoResult, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.stages[ref]
	if c.stageInfoHook != nil {
		c.stageInfoHook()
	}
	if !ok {
		return nil, fmt.Errorf("stage %q: %w", ref, errdefs.ErrNotFound)
	}
	return &stages.StageInfoResult{OK: true, Stage: stages.StageEntry{ID: id}}, nil
}

func (c *transferCore) PullStage(_ context.Context, repo, ref string) (*stages.StagePullResult, error) {
	c.pulls.Add(1)
	time.Sleep(100 * time.Millisecond) // long enough for calls to meet
	if c.gate != nil {
		<-c.gate
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id, ok := c.registry[ref]
	if repo != c.repo || !ok {
		return nil, fmt.Errorf("%s:%s: manifest unknown: %w", repo, ref, errdefs.ErrNotFound)
	}
	c.stages[id] = id
	return &stages.StagePullResult{OK: true, Stage: stages.StageEntry{ID: id}, PullResult: &transfer.PullResult{}}, nil
}

func (c *transferCore) StagePush(_ context.Context, ref, dest string, _ stages.StagePushOptions) (*stages.StagePushResult, error) {
	if c.pushFail != nil {
		return nil, c.pushFail
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.pushed = append(c.pushed, dest)
	return &stages.StagePushResult{OK: true, PushResult: &transfer.PushResult{Ref: dest}}, nil
}

func TestStagesOnDemand(t *testing.T) {
	core := newTransferCore("reg.test/isopod/stages")
	id := "st-00112233445566aa"
	core.registry[labelTag("team/deps")] = id
	core.run = func(_ context.Context, req sandbox.Request) (*report.Run, error) {
		if req.Stage != id {
			return nil, fmt.Errorf("ran %q, want the pulled %s", req.Stage, id)
		}
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}, ForkedFrom: req.Stage}, nil
	}
	s := connect(t, Config{Core: core, StageRegistry: core.repo, NoStartupGC: true})
	var wg sync.WaitGroup
	results := make([]RunResult, 3)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "stage": "team/deps"}, nil))
		}()
	}
	wg.Wait()
	if n := core.pulls.Load(); n != 1 {
		t.Errorf("%d pulls for three calls at once, want 1", n)
	}
	for i, r := range results {
		if r.Registry == nil || !strings.HasSuffix(r.Registry.Pulled, ":"+labelTag("team/deps")) {
			t.Errorf("call %d: registry %+v", i, r.Registry)
		}
	}
	// Now here: nothing is pulled.
	if r := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "stage": id}, nil)); r.Registry != nil {
		t.Errorf("a stage here was pulled: %+v", r.Registry)
	}
	// Neither here nor there: the refusal names the registry.
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "stage": "team/other"}, nil)
	if !res.IsError || !strings.Contains(resultText(res), core.repo) || !strings.Contains(resultText(res), "not on this host") {
		t.Errorf("a stage nowhere: %s", resultText(res))
	}
}

// TestStageHereResolvedOnce: a stage this host has is resolved once, by
// the server, and the run forks the stage found by its id, even when its
// label has moved to another stage since.
func TestStageHereResolvedOnce(t *testing.T) {
	core := newTransferCore("reg.test/isopod/stages")
	first, second := "st-00112233445566cc", "st-00112233445566dd"
	core.stages["team/deps"], core.stages[first], core.stages[second] = first, first, second
	core.run = func(_ context.Context, req sandbox.Request) (*report.Run, error) {
		if req.Stage != first {
			return nil, fmt.Errorf("ran %q, want the stage the label named when the call came, %s", req.Stage, first)
		}
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}, ForkedFrom: req.Stage}, nil
	}
	core.stageInfoHook = func() {
		// The label moves once the server has resolved it.
		core.stages["team/deps"] = second
	}
	s := connect(t, Config{Core: core, StageRegistry: core.repo, NoStartupGC: true})
	r := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "stage": "team/deps"}, nil))
	if r.ForkedFrom != first || r.Registry != nil {
		t.Errorf("forked %q (registry %+v); want %s, nothing pulled", r.ForkedFrom, r.Registry, first)
	}
}

func TestPushCommits(t *testing.T) {
	core := newTransferCore("reg.test/isopod/stages")
	core.run = func(context.Context, sandbox.Request) (*report.Run, error) {
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}, StageID: "st-00112233445566bb", StageName: "x"}, nil
	}
	s := connect(t, Config{Core: core, StageRegistry: core.repo, PushCommits: true, NoStartupGC: true})
	r := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "commit_as": "team/deps"}, nil))
	want := []string{core.repo + ":" + labelTag("team/deps"), core.repo + ":st-00112233445566bb"}
	if fmt.Sprint(core.pushed) != fmt.Sprint(want) || r.Registry == nil || len(r.Registry.Pushed) != 2 {
		t.Errorf("pushed %v (result %+v), want %v", core.pushed, r.Registry, want)
	}
	core.pushFail = fmt.Errorf("registry down: %w", errdefs.ErrUnavailable)
	r = reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true", "commit_as": "team/deps2"}, nil))
	if r.Registry == nil || !strings.Contains(r.Registry.PushError, "registry down") || r.StageID == "" {
		t.Errorf("a failed push: %+v", r.Registry)
	}
	if _, err := New(Config{Core: core, PushCommits: true}); err == nil {
		t.Error("PushCommits without a registry was accepted")
	}
}

// TestStagePullWaitsAtMostTimeout: calls that need a stage whose pull does
// not end stop waiting at their own timeout_s, unavailable, while the one
// pull goes on; once it ends, a call finds the stage here. A call whose
// pull ends in time runs with what is left of its timeout_s.
func TestStagePullWaitsAtMostTimeout(t *testing.T) {
	t.Parallel()
	core := newTransferCore("reg.test/isopod/stages")
	id := "st-00112233445566cc"
	core.registry[id] = id
	core.gate = make(chan struct{})
	var ran atomic.Int32
	core.run = func(_ context.Context, req sandbox.Request) (*report.Run, error) {
		ran.Store(int32(req.TimeoutS))
		code := 0
		return &report.Run{Outcome: report.Outcome{ExitCode: &code}, ForkedFrom: req.Stage}, nil
	}
	s := connect(t, Config{Core: core, StageRegistry: core.repo, NoStartupGC: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for _, timeout := range []int{1, 2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			res := s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true", "stage": id, "timeout_s": timeout}, nil)
			took, msg := time.Since(start), resultText(res)
			if !res.IsError || !strings.Contains(msg, "(unavailable)") || !strings.Contains(msg, fmt.Sprintf("timeout_s (%ds)", timeout)) {
				t.Errorf("timeout_s %d: %s; want an unavailable error naming timeout_s", timeout, msg)
			}
			if want := time.Duration(timeout) * time.Second; took < want || took > want+5*time.Second {
				t.Errorf("timeout_s %d: answered after %s", timeout, took)
			}
		}()
	}
	wg.Wait()
	if n := core.pulls.Load(); n != 1 {
		t.Errorf("%d pulls; want the one both calls waited for", n)
	}
	close(core.gate)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := core.StageInfo(ctx, id); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the pull the calls gave up on did not go on")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := reportOf(t, s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true", "stage": id, "timeout_s": 5}, nil)); r.Registry != nil || ran.Load() != 5 {
		t.Errorf("a call after the pull: registry %+v, ran with timeout_s %d; want the stage found here and all 5 s", r.Registry, ran.Load())
	}
	core.registry["st-00112233445566dd"] = "st-00112233445566dd"
	r := reportOf(t, s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true", "stage": "st-00112233445566dd", "timeout_s": 5}, nil))
	if r.Registry == nil || r.Registry.Pulled == "" || ran.Load() != 5 {
		t.Errorf("a pull of about 100 ms: registry %+v, ran with timeout_s %d; want 5 (what is left, rounded up)", r.Registry, ran.Load())
	}
}
