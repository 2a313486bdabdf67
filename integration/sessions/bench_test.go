package sessions

import (
	"sort"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// p50 is the median of xs.
func p50(xs []int64) int64 {
	s := append([]int64(nil), xs...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

// TestBenchSessionPause measures, in one sitting, a 512 MiB session's
// pause (its time, per GiB of RAM held, what it holds on disk) and
// resume against a warm run's resume (resume_ms: the restore and the
// guest's hello, for both), and a fork of a running session (its
// resume_total_ms: the parent's snapshot and copies, the child's
// admission, network, restore and hello) against a warm run's total_ms.
// ISOPOD_BENCH=1 runs it (scripts/bench-session-pause.sh).
func TestBenchSessionPause(t *testing.T) {
	e2e.RequireVM(t)
	if !e2e.BenchEnabled() {
		t.Skip("benchmark: set ISOPOD_BENCH=1")
	}
	const n = 10
	// Warm runs, the first building the shape's snapshot.
	e2e.Isopod(t, nil, "run", "--no-network", "--mem-mib", "512", "--", "true")
	var runResume, runTotal []int64
	for range n {
		r := e2e.Isopod(t, nil, "run", "--no-network", "--mem-mib", "512", "--", "true")
		if r.Code != 0 || e2e.Str(r.JSON, "path") != "warm" {
			t.Fatalf("warm run: %s", r)
		}
		runResume = append(runResume, e2e.Num(t, r.JSON, "resume_ms"))
		runTotal = append(runTotal, e2e.Num(t, r.JSON, "total_ms"))
	}
	id, _ := startEnv(t, nil, "--no-network", "--mem-mib", "512")
	// Some RAM in use: 256 MiB of random bytes on a tmpfs.
	isopod(t, "session", "exec", id, "--timeout-s", "600", "--shell", "--",
		"mkdir -p /mnt/fill && mount -t tmpfs tmpfs /mnt/fill && head -c 268435456 /dev/urandom > /mnt/fill/x")
	var pauseMS, perGiB, mem, disk, resumeMS, resumeTotal, forkMS, forkWall []int64
	for range n {
		r := pause(t, id)
		pm, mb := e2e.Num(t, r.JSON, "pause_ms"), e2e.Num(t, r.JSON, "memory_bytes")
		pauseMS, mem, disk = append(pauseMS, pm), append(mem, mb), append(disk, e2e.Num(t, r.JSON, "disk_bytes"))
		perGiB = append(perGiB, pm*(1<<30)/max(mb, 1))
		r = isopod(t, "session", "resume", id)
		resumeMS = append(resumeMS, e2e.Num(t, r.JSON, "resume_ms"))
		resumeTotal = append(resumeTotal, e2e.Num(t, r.JSON, "resume_total_ms"))
	}
	for range 5 {
		t0 := time.Now()
		c := fork(t, id)
		forkWall = append(forkWall, time.Since(t0).Milliseconds())
		forkMS = append(forkMS, readRecord(t, c).ResumeTotalMS)
		e2e.Isopod(t, nil, "session", "stop", c)
	}
	// A fork of a session that holds only what its guest touched to boot
	// and idle, as most do.
	idle, _ := startEnv(t, nil, "--no-network", "--mem-mib", "512")
	isopod(t, "session", "exec", idle, "--", "true")
	var idleFork []int64
	for range 5 {
		c := fork(t, idle)
		idleFork = append(idleFork, readRecord(t, c).ResumeTotalMS)
		e2e.Isopod(t, nil, "session", "stop", c)
	}
	t.Logf("warm run (512 MiB): resume_ms p50 %d, total_ms p50 %d", p50(runResume), p50(runTotal))
	t.Logf("session pause (512 MiB, 256 MiB filled): pause_ms p50 %d (%d per GiB held), memory_bytes p50 %d, disk_bytes p50 %d",
		p50(pauseMS), p50(perGiB), p50(mem), p50(disk))
	t.Logf("session resume: resume_ms p50 %d (%.2f x a warm run's), resume_total_ms p50 %d",
		p50(resumeMS), float64(p50(resumeMS))/float64(max(p50(runResume), 1)), p50(resumeTotal))
	t.Logf("session fork of a running session: resume_total_ms p50 %d (%.2f x a warm run's total_ms), CLI wall p50 %d ms",
		p50(forkMS), float64(p50(forkMS))/float64(max(p50(runTotal), 1)), p50(forkWall))
	t.Logf("session fork of an idle running session: resume_total_ms p50 %d (%.2f x a warm run's total_ms)",
		p50(idleFork), float64(p50(idleFork))/float64(max(p50(runTotal), 1)))
}
