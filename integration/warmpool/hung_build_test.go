package warmpool

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// A run whose snapshot VM hangs (its QEMU stopped with SIGSTOP, as a VM
// that never boots would) ends within its timeout: the build is given up
// after half of it, the snapshot VM is killed, and the run cold-boots in
// the other half, saying so; no QEMU is left.
func TestHungSnapshotVM(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
	const timeoutS = 60
	// The first QEMU of the run is its snapshot VM: the home has no
	// snapshot yet.
	stopped := make(chan int, 1)
	quit := make(chan struct{})
	go func() {
		for {
			if pids := e2e.VMMsOf(home); len(pids) > 0 {
				syscall.Kill(pids[0], syscall.SIGSTOP)
				stopped <- pids[0]
				return
			}
			select {
			case <-quit:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t0 := time.Now()
	r := e2e.Isopod(t, env, "run", "--base", "base-min", "--timeout-s", strconv.Itoa(timeoutS), "--", "uname", "-r")
	wall := time.Since(t0)
	close(quit)
	var pid int
	select {
	case pid = <-stopped:
	default:
		t.Fatalf("no QEMU was seen to stop:\n%s", r)
	}
	t.Logf("run of %d s with its snapshot VM stopped: %v, total_ms %v, path %v", timeoutS, wall.Round(time.Millisecond), r.JSON["total_ms"], r.JSON["path"])
	// A few seconds for the process itself and the VM's teardown.
	limit := timeoutS*time.Second + 5*time.Second
	if wall > limit || time.Duration(e2e.Num(t, r.JSON, "total_ms"))*time.Millisecond > limit {
		t.Errorf("the run took %v (total_ms %v); want at most its timeout of %d s and 5 s", wall, r.JSON["total_ms"], timeoutS)
	}
	if r.Code != 0 || r.JSON["exit_code"] != float64(0) || r.JSON["path"] != "cold" || r.JSON["snapshot_built"] == true {
		t.Errorf("want a cold boot that ran the command, no snapshot built:\n%s", r)
	}
	if w := r.JSON["warnings"]; !strings.Contains(strings.Join(strs(w), "\n"), "the snapshot VM was killed") {
		t.Errorf("warnings %v; want one saying the snapshot VM was killed", w)
	}
	if _, err := os.Stat(filepath.Join("/proc", strconv.Itoa(pid))); err == nil {
		t.Errorf("the stopped snapshot VM's QEMU %d is still there", pid)
		syscall.Kill(pid, syscall.SIGKILL)
	}
	if left := e2e.VMMsOf(home); len(left) > 0 {
		t.Errorf("QEMU %v left", left)
	}
	if n := len(snapshotDirs(t, env)); n != 0 {
		t.Errorf("%d snapshots; want none from the build given up", n)
	}
}

// strs is a JSON array of strings.
func strs(v any) []string {
	var out []string
	l, _ := v.([]any)
	for _, e := range l {
		s, _ := e.(string)
		out = append(out, s)
	}
	return out
}
