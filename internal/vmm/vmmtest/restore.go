package vmmtest

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// testSnapshotOfRestored: a machine restored with RAM of its own can be
// snapshotted again, and that snapshot restores; one restored without
// cannot.
func testSnapshotOfRestored(t *testing.T, ctx context.Context, r vmm.Restorer, config func() vmm.Config, dir string) {
	plain := Restore(t, r, config(), dir)
	if err := plain.M.(vmm.Snapshotter).Snapshot(ctx, t.TempDir()); !errors.Is(err, errdefs.ErrNotSupported) {
		t.Errorf("Snapshot of a machine restored without RAM of its own: %v; want ErrNotSupported", err)
	}
	plain.M.Kill()
	plain.M.Wait()
	cfg := config()
	cfg.OwnRAM, cfg.RAMFile, cfg.RAMCopy = true, filepath.Join(t.TempDir(), "ram"), true
	own := Restore(t, r, cfg, dir)
	own.Ping(t)
	again := t.TempDir()
	if err := own.M.(vmm.Snapshotter).Snapshot(ctx, again); err != nil {
		t.Fatalf("Snapshot of a machine restored with RAM of its own: %v", err)
	}
	own.M.Kill()
	own.M.Wait()
	s := Restore(t, r, config(), again)
	s.Ping(t)
	s.M.Kill()
	s.M.Wait()
}

// testPausedRestore: a machine restored paused answers nothing until it is
// resumed, then serves as any restored one; a cold start cannot be paused.
func testPausedRestore(t *testing.T, ctx context.Context, r vmm.Restorer, config func() vmm.Config, dir string) {
	cfg := config()
	cfg.Paused = true
	s := start(t, cfg, func(ctx context.Context, cfg vmm.Config) (vmm.Machine, error) { return r.Restore(ctx, cfg, dir) })
	res, ok := s.M.(vmm.Resumer)
	if !ok {
		t.Fatalf("%T restored paused but is not a vmm.Resumer", s.M)
	}
	pctx, pcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if err := s.Client.Call(pctx, &agentproto.Msg{Kind: agentproto.KindPing}, nil); err == nil {
		t.Errorf("a paused guest answered a ping")
	}
	pcancel()
	if err := res.Resume(ctx); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if err := res.Resume(ctx); err != nil {
		t.Errorf("a second Resume: %v; want nothing done", err)
	}
	h, err := s.Client.Hello(ctx)
	s.hello(t, h, err)
	s.Ping(t)
	s.M.Kill()
	s.M.Wait()

	cold := config()
	cold.Paused = true
	if drv, ok := r.(vmm.Driver); ok {
		if m, err := drv.Start(ctx, cold); !errors.Is(err, errdefs.ErrInvalidArgument) {
			if err == nil {
				m.Kill()
				m.Wait()
			}
			t.Errorf("Start with Paused: %v; want ErrInvalidArgument", err)
		}
	}
}
