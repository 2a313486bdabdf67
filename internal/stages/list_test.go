package stages_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/sandbox"
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/stages"
	"isopod/internal/vmm/vmmfake"
)

// newStore returns a stage store and a core over one fresh test root,
// whose VMM is vmmfake; removed counts the stages the store removed.
func newStore(t *testing.T) (st *stages.Service, core *sandbox.Service, removed *int) {
	t.Helper()
	p, kernel := sandboxtest.Root(t, image.FlavorBaseMin)
	d, err := vmmfake.New(vmmfake.Config{})
	if err != nil {
		t.Fatal(err)
	}
	set := settings.Settings{Paths: p, Kernel: kernel, NoWarmPool: true}
	core, err = sandbox.New(sandbox.Options{Settings: set, Driver: d, Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(core.Close)
	removed = new(int)
	st = stages.New(stages.Options{Settings: set, Version: "test", Removed: func() { *removed++ }})
	return st, core, removed
}

// commit runs cmd on stage and commits it as label; it returns the id.
func commit(t *testing.T, core *sandbox.Service, stage, label, cmd string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := core.Run(ctx, sandbox.Request{Argv: []string{"sh", "-c", cmd}, NoNetwork: true, Stage: stage, CommitAs: label})
	if err != nil || rep.StageID == "" {
		t.Fatalf("commit %s: %+v, %v", label, rep, err)
	}
	return rep.StageID
}

// TestStageHousekeeping: a chain of two stages listed, described, logged
// and removed tip first; the removal is told to the core.
func TestStageHousekeeping(t *testing.T) {
	t.Parallel()
	st, core, removed := newStore(t)
	ctx := context.Background()
	a := commit(t, core, sandbox.BaseStage, "one", "echo 1 > /one")
	b := commit(t, core, "one", "two", "echo 2 > /two")

	list, err := st.StageList(ctx)
	if err != nil || len(list.Stages) != 2 || list.Stages[0].ID != a || list.Stages[1].ID != b {
		t.Fatalf("list: %+v, %v; want %s then %s", list, err, a, b)
	}
	for _, e := range list.Stages {
		if e.Stale || e.BaseFlavor != image.FlavorBaseMin {
			t.Errorf("entry %+v: want a current stage over base-min", e)
		}
	}
	info, err := st.StageInfo(ctx, "two")
	if err != nil || info.Stage.ID != b || len(info.Chain) != 2 || len(info.LayerPaths) != 2 {
		t.Fatalf("info: %+v, %v", info, err)
	}
	lg, err := st.StageLog(ctx, "two")
	if err != nil || lg.Base != image.FlavorBaseMin || len(lg.Layers) != 2 {
		t.Errorf("log: %+v, %v", lg, err)
	}
	if _, err := st.StageInfo(ctx, sandbox.BaseStage); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("info of the empty stage: %v; want invalid_argument", err)
	}
	if _, err := st.StagePush(ctx, sandbox.BaseStage, "reg.test/x:y", stages.StagePushOptions{}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("push of the empty stage: %v; want invalid_argument", err)
	}
	if _, err := st.StageRemove(ctx, "one"); err == nil {
		t.Error("a stage another builds on was removed")
	}
	for _, ref := range []string{"two", "one"} {
		if res, err := st.StageRemove(ctx, ref); err != nil || res.Label != ref {
			t.Errorf("rm %s: %+v, %v", ref, res, err)
		}
	}
	if *removed != 2 {
		t.Errorf("the core was told of %d removals; want 2", *removed)
	}
	if list, err := st.StageList(ctx); err != nil || len(list.Stages) != 0 {
		t.Errorf("list after removal: %+v, %v", list, err)
	}
}

// TestImageListAndRemove: the listing has the built base and no hint for
// it; a built base is not removed as an imported one.
func TestImageListAndRemove(t *testing.T) {
	t.Parallel()
	st, _, _ := newStore(t)
	ctx := context.Background()
	list, err := st.ImageList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, e := range list.Images {
		if e.Flavor == image.FlavorBaseMin {
			found = e.Built && e.Kind == image.KindBuilt && e.Hint == ""
		}
	}
	if !found {
		t.Errorf("image list %+v; want base-min built, with no hint", list.Images)
	}
	if _, err := st.ImageRemove(ctx, "no-such-base"); err == nil {
		t.Error("removing a base that is not here succeeded")
	}
}
