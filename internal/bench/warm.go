package bench

import (
	"context"
	"fmt"
	"os"
	"sort"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// WarmResult compares cold and warm runs of `true` side by side.
type WarmResult struct {
	OK    bool      `json:"ok"`
	N     int       `json:"n"`
	Accel vmm.Accel `json:"accel"`
	// SnapshotBuildMS is set when the bench had to build the snapshots
	// (the plain one and the one with the root assembled).
	SnapshotBuildMS int64 `json:"snapshot_build_ms,omitempty"`

	ColdTotalMS []int64 `json:"cold_total_ms"`
	WarmTotalMS []int64 `json:"warm_total_ms"`
	ResumeMS    []int64 `json:"resume_ms"`
	// QEMUFloorMS is the VMM alone: process start to guest running, device
	// state loaded, no agent and no run around it.
	QEMUFloorMS []int64 `json:"qemu_floor_ms"`

	ColdTotalP50 int64 `json:"cold_total_p50_ms"`
	WarmTotalP50 int64 `json:"warm_total_p50_ms"`
	ResumeP50    int64 `json:"resume_p50_ms"`
	QEMUFloorP50 int64 `json:"qemu_floor_p50_ms"`
	// WarmOverCold is warm total p50 / cold total p50 (target <= 0.12);
	// ResumeOverFloor is resume p50 / QEMU floor p50 (target <= 1.5).
	WarmOverCold    float64 `json:"warm_over_cold"`
	ResumeOverFloor float64 `json:"resume_over_floor"`
	// WarmVMsPerMinute is how many warm runs finish per minute one after
	// another: n over the wall clock of the warm Run calls, each with its
	// teardown.
	WarmVMsPerMinute float64 `json:"warm_vms_per_minute"`
}

// warm measures n cold runs, n warm runs and n bare restores of the
// default key (base-min, default sizes, networking on), alternating; the
// warm runs resume from its snapshot with the root assembled. The cold
// runs are the same request on the Service with the warm pool off.
func (b *bench) warm(ctx context.Context, n int) (*WarmResult, error) {
	s := b.s
	if n < 1 {
		return nil, invalid("bench: n %d < 1", n)
	}
	res := &WarmResult{OK: true, N: n}
	if err := b.warmSnapshots(ctx, res); err != nil {
		return nil, err
	}
	one := func(req sandbox.Request) (*report.Run, error) {
		rep, err := s.Run(ctx, req)
		if err != nil {
			return nil, err
		}
		if rep.ExitCode == nil || *rep.ExitCode != 0 {
			return nil, fmt.Errorf("bench: `true` did not exit 0 (see %s)", rep.SerialLogPath)
		}
		return rep, nil
	}
	// A cold run, a warm run and a bare restore each round, so that the
	// host's drift (its load, its neighbours' on a shared machine) falls
	// on the three series alike. Each run's teardown ends before the next
	// starts; a warm run's counts towards its throughput.
	var warmWall time.Duration
	for i := 0; i < n; i++ {
		rep, err := b.cold.Run(ctx, sandbox.Request{Argv: []string{"true"}})
		b.cold.Wait()
		if err != nil {
			return nil, err
		}
		if rep.Path != "cold" {
			return nil, fmt.Errorf("bench: the cold side resumed: give the bench a Service with the warm pool off: %w", errdefs.ErrFailedPrecondition)
		}
		res.ColdTotalMS = append(res.ColdTotalMS, rep.TotalMS)
		t := time.Now()
		rep, err = one(sandbox.Request{Argv: []string{"true"}})
		s.Wait()
		warmWall += time.Since(t)
		if err != nil {
			return nil, err
		}
		if rep.Path != "warm" || rep.ResumeMS == nil || !rep.RootAssembled {
			return nil, fmt.Errorf("bench: run %s did not resume (warnings: %v): %w", rep.VMID, rep.Warnings, errdefs.ErrFailedPrecondition)
		}
		res.WarmTotalMS = append(res.WarmTotalMS, rep.TotalMS)
		res.ResumeMS = append(res.ResumeMS, *rep.ResumeMS)
		ms, err := b.restoreFloor(ctx)
		if err != nil {
			return nil, err
		}
		res.QEMUFloorMS = append(res.QEMUFloorMS, ms)
	}
	res.WarmVMsPerMinute = float64(n) / warmWall.Minutes()
	res.ColdTotalP50, res.WarmTotalP50 = p50(res.ColdTotalMS), p50(res.WarmTotalMS)
	res.ResumeP50, res.QEMUFloorP50 = p50(res.ResumeMS), p50(res.QEMUFloorMS)
	if res.ColdTotalP50 > 0 {
		res.WarmOverCold = float64(res.WarmTotalP50) / float64(res.ColdTotalP50)
	}
	if res.QEMUFloorP50 > 0 {
		res.ResumeOverFloor = float64(res.ResumeP50) / float64(res.QEMUFloorP50)
	}
	return res, nil
}

// warmSnapshots builds, where missing, the default key's plain snapshot
// and the one with its root assembled: the warm runs recur, so they
// resume from the latter, built here rather than inside one of them.
func (b *bench) warmSnapshots(ctx context.Context, res *WarmResult) error {
	for _, opts := range []warmpool.BuildOptions{{}, {Stage: sandbox.BaseStage}} {
		wb, err := b.s.WarmBuild(ctx, opts)
		if err != nil {
			return err
		}
		if wb.Built {
			res.SnapshotBuildMS += wb.BuildMS
		}
		res.Accel = wb.Accel
	}
	return nil
}

// restoreFloor times the VMM alone restoring the default snapshot: from the
// Restore call to the guest running (Restore returns after the device state
// is loaded and the guest continued).
func (b *bench) restoreFloor(ctx context.Context) (int64, error) {
	drv, err := b.s.Driver(ctx)
	if err != nil {
		return 0, err
	}
	restorer, ok := drv.(vmm.Restorer)
	if !ok {
		return 0, fmt.Errorf("bench: the VMM cannot restore snapshots: %w", errdefs.ErrNotSupported)
	}
	dir, err := os.MkdirTemp("", "isopod-floor-")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	snap, cfg, closeNet, err := b.s.RestoreFloor(ctx, dir)
	if err != nil {
		return 0, err
	}
	defer closeNet()
	t := time.Now()
	m, err := restorer.Restore(ctx, cfg, snap)
	ms := time.Since(t).Milliseconds()
	if err != nil {
		return 0, fmt.Errorf("bench: restore: %w", err)
	}
	m.Kill()
	m.Wait()
	m.Agent().Close()
	return ms, nil
}

func p50(v []int64) int64 {
	if len(v) == 0 {
		return 0
	}
	s := append([]int64(nil), v...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}
