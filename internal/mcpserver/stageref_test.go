package mcpserver

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"isopod/internal/store"
)

// TestStageIDPrefix: a stage_id prefix of at least store.MinIDPrefix hex
// digits, with or without st-, names the stage in stage_info and in
// sandbox_run's stage, as the schema says; a shorter one is refused saying
// how many digits it takes.
func TestStageIDPrefix(t *testing.T) {
	core, _ := newFakeCore(t)
	s := connect(t, Config{Core: core, NoStartupGC: true})
	ctx := context.Background()
	res := s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true", "base": "base-min", "network": false, "cwd": "/", "commit_as": "proj/deps"}, nil)
	rep := reportOf(t, res)
	if !store.IDPattern.MatchString(rep.StageID) {
		t.Fatalf("commit made stage %q (%s)", rep.StageID, rep.CommitError)
	}
	withSt := rep.StageID[:len(store.IDPrefix)+store.MinIDPrefix]
	bare := strings.TrimPrefix(withSt, store.IDPrefix)

	for _, ref := range []string{withSt, bare} {
		res := s.call(t, ctx, ToolStageInfo, map[string]any{"reference": ref}, nil)
		if res.IsError {
			t.Fatalf("stage_info %q: %s", ref, resultText(res))
		}
		var info StageInfoResult
		raw, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(raw, &info); err != nil || info.Stage.ID != rep.StageID {
			t.Errorf("stage_info %q = %s (%v); want %s", ref, raw, err, rep.StageID)
		}
	}
	fork := reportOf(t, s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "true", "stage": withSt, "network": false, "cwd": "/"}, nil))
	if fork.ForkedFrom != rep.StageID {
		t.Errorf("sandbox_run stage %q forked %q; want %s", withSt, fork.ForkedFrom, rep.StageID)
	}

	short := rep.StageID[:len(store.IDPrefix)+store.MinIDPrefix-1]
	res = s.call(t, ctx, ToolStageInfo, map[string]any{"reference": short}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, "at least 4 hex digits") || !strings.Contains(text, "refused") {
		t.Errorf("stage_info %q: %s", short, text)
	}
}
