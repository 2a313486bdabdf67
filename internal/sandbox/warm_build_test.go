package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"isopod/internal/sandbox"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// teardownMargin is what a run may take beyond its timeout: a report
// is due within the timeout and the VM's end (the guest enforces the
// command's timeout, the host allows a few seconds more).
const teardownMargin = 2 * time.Second

// A snapshot build inside a run is charged to the run's timeout: when it
// hangs (here its guest never boots) it is given up after half of the
// timeout, its VM killed, and the run cold-boots in the other half; the
// report says so. A run whose timeout is too short for a build builds
// nothing. Either way the run ends within its timeout.
func TestSnapshotBuildWithinTheRunsTimeout(t *testing.T) {
	sandbox.SetInlineBuildMin(t, time.Second)
	for _, tt := range []struct {
		name     string
		timeoutS int
		hang     func(vmm.Config) bool
		warning  string
		timedOut bool
	}{
		{"a hung build", 4, isBuilder, "did not finish within 2.0 s", false},
		{"too short for a build", 1, isBuilder, "too short for a build", false},
		{"nothing boots", 4, func(vmm.Config) bool { return true }, "did not finish within", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // the parent, serial, holds inlineBuildMin for all three
			s, d := newFakeService(t, vmmfake.Config{Hang: tt.hang})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			t0 := time.Now()
			rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"echo", "hi"}, Cwd: "/", TimeoutS: tt.timeoutS})
			wall := time.Since(t0)
			if err != nil {
				t.Fatalf("Run: %v after %v", err, wall)
			}
			limit := time.Duration(tt.timeoutS)*time.Second + teardownMargin
			if wall > limit || time.Duration(rep.TotalMS)*time.Millisecond > limit {
				t.Errorf("the run took %v (total_ms %d); want at most its timeout of %d s and %v", wall, rep.TotalMS, tt.timeoutS, teardownMargin)
			}
			switch {
			case tt.timedOut && !rep.TimedOut:
				t.Errorf("not timed out: %+v", rep)
			case !tt.timedOut && (rep.TimedOut || rep.Path != "cold" || rep.Stdout != "hi\n" || code(rep) != 0):
				t.Errorf("timed out %v path %q stdout %q exit %d; want a cold boot that ran the command", rep.TimedOut, rep.Path, rep.Stdout, code(rep))
			}
			if rep.SnapshotBuilt || !strings.Contains(strings.Join(rep.Warnings, "\n"), tt.warning) {
				t.Errorf("snapshot_built %v, warnings %q; want none built and a warning saying %q", rep.SnapshotBuilt, rep.Warnings, tt.warning)
			}
			for _, m := range d.Machines() {
				select {
				case <-m.Done():
				default:
					t.Errorf("machine %s (builder %v) still runs after the run", m.Config().ID, isBuilder(m.Config()))
				}
			}
		})
	}
}
