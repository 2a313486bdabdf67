// Package storms runs isopod under load and under faults: many runs at
// once on a small host, and runs killed at random moments, after which the
// housekeeping must leave nothing behind.
package storms

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// TestEightAtOnce: eight runs at once on a small host, cold and warm,
// committing and not, each with its own timeout: every one ends ok (or
// timed out by its own limit), none fails by an internal wait.
func TestEightAtOnce(t *testing.T) {
	e2e.RequireVM(t)
	label := fmt.Sprintf("storm-%d", os.Getpid())
	shapes := [][]string{
		{"run", "--no-network", "--timeout-s", "600", "--", "sh", "-c", "echo cold"},
		{"run", "--timeout-s", "600", "--", "sh", "-c", "echo warm"},
		{"run", "--no-network", "--timeout-s", "600", "--commit-as", label + "-a", "--", "sh", "-c", "echo a > /root/a"},
		{"run", "--timeout-s", "600", "--", "sh", "-c", "head -c 1048576 /dev/urandom | sha256sum"},
		{"run", "--no-network", "--timeout-s", "600", "--", "sh", "-c", "i=0; while [ $i -lt 200 ]; do i=$((i+1)); done; echo loop"},
		{"run", "--timeout-s", "600", "--commit-as", label + "-b", "--", "sh", "-c", "echo b > /root/b"},
		{"run", "--no-network", "--timeout-s", "5", "--", "sleep", "600"}, // ends by its own timeout
		{"run", "--timeout-s", "600", "--", "true"},
	}
	// Eight places: the host's default on a small host is fewer, and a
	// run waits for a place at most its own timeout.
	env := []string{knobs.MaxVMs + "=8"}
	results := e2e.Parallel(len(shapes), func(i int) *e2e.Result { return e2e.Isopod(t, env, shapes[i]...) })
	for i, r := range results {
		if r.Code != 0 || r.JSON["ok"] != true {
			t.Errorf("run %d (%v) failed:\n%s", i, shapes[i], r)
			continue
		}
		timedOut := r.JSON["timed_out"] == true
		if want := i == 6; timedOut != want {
			t.Errorf("run %d: timed_out %v; want %v:\n%s", i, timedOut, want, r)
		}
		if !timedOut && e2e.Num(t, r.JSON, "exit_code") != 0 {
			t.Errorf("run %d: exit %v:\n%s", i, r.JSON["exit_code"], r)
		}
	}
	for _, l := range []string{label + "-a", label + "-b"} {
		e2e.Isopod(t, nil, "stage", "rm", l)
	}
}

// shape is one kind of run the fault storm kills.
type shape struct {
	name string
	args func(dir string, i int) []string
}

var killShapes = []shape{
	{"cold", func(string, int) []string {
		return []string{"run", "--no-network", "--", "sh", "-c", "sleep 2; echo x"}
	}},
	{"warm", func(string, int) []string { return []string{"run", "--", "sh", "-c", "sleep 1; echo x"} }},
	{"commit", func(_ string, i int) []string {
		return []string{"run", "--no-network", "--commit-as", fmt.Sprintf("killed-%d-%d", os.Getpid(), i), "--",
			"sh", "-c", "head -c 20971520 /dev/urandom > /root/big"}
	}},
	{"copy-out", func(dir string, i int) []string {
		return []string{"run", "--no-network", "--copy-out", "/root/big:" + filepath.Join(dir, "out-"+strconv.Itoa(i)), "--",
			"sh", "-c", "head -c 52428800 /dev/urandom > /root/big"}
	}},
	{"snapshot build", func(string, int) []string { return []string{"run", "--mem-mib", "384", "--", "true"} }},
}

// TestKilledRuns kills fifty isopod processes at random moments (booting,
// running, copying out, committing, building a snapshot); afterwards vm gc
// leaves no VMM, no socket, no scratch disk, no staging file, no half stage
// and no cgroup, and stage list shows only complete stages.
func TestKilledRuns(t *testing.T) {
	e2e.RequireVM(t)
	// A run of each kind works before any is killed: a storm of runs that
	// fail at once would prove nothing.
	e2e.Run(t, "--no-network", "--", "true")
	dir := t.TempDir()
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	const n = 50
	delays := make([]time.Duration, n)
	for i := range delays {
		delays[i] = time.Duration(rng.Int64N(int64(6 * time.Second)))
	}
	ids := make([]string, n)
	for i := 0; i < n; i += 2 {
		// Two at a time, so that the host is loaded but not swamped.
		e2e.Parallel(2, func(j int) *e2e.Result {
			s := killShapes[(i+j)%len(killShapes)]
			if s.name == "snapshot build" {
				e2e.Isopod(t, nil, "warmpool", "rm", "--all")
			}
			ids[i+j] = killAfter(t, s.args(dir, i+j), delays[i+j])
			return nil
		})
	}
	started := 0
	for _, id := range ids {
		if id != "" {
			started++
		}
	}
	if started < n/2 {
		t.Fatalf("only %d of %d killed runs had started a VM; the storm proves nothing", started, n)
	}
	gc := e2e.Isopod(t, nil, "vm", "gc", "--keep-last", "0")
	if gc.Code != 0 {
		t.Fatalf("vm gc:\n%s", gc)
	}
	checkNothingLeft(t, dir, ids)
	list := e2e.Isopod(t, nil, "stage", "list")
	stages, _ := list.JSON["stages"].([]any)
	for _, s := range stages {
		m := s.(map[string]any)
		layer := filepath.Join(e2e.HomeDir, "stages", e2e.Str(m, "stage_id"), "layer.ext4")
		if _, err := os.Stat(layer); err != nil {
			t.Errorf("stage list shows %s without its layer: %v", e2e.Str(m, "stage_id"), err)
		}
		e2e.Isopod(t, nil, "stage", "rm", e2e.Str(m, "stage_id"))
	}
}

// killAfter starts isopod with args, SIGKILLs it after delay (unless it
// ended) and returns the id of the VM it recorded ("" if none yet).
func killAfter(t *testing.T, args []string, delay time.Duration) string {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod"), args...)
	cmd.Env = append(os.Environ(), "ISOPOD_AGENT_BIN="+filepath.Join(e2e.BinDir, "isopod-agent"))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(delay):
		cmd.Process.Signal(syscall.SIGKILL)
		<-done
	}
	return e2e.VMOfOwner(cmd.Process.Pid)
}

// checkNothingLeft looks for what the killed runs could have left.
func checkNothingLeft(t *testing.T, dir string, ids []string) {
	t.Helper()
	for _, id := range ids {
		if id == "" {
			continue
		}
		if pids := e2e.QEMUPIDs(t, "isopod-"+id); len(pids) > 0 {
			t.Errorf("QEMU of %s still runs: %v", id, pids)
		}
		// Run sockets live under a directory per state root.
		if left, _ := filepath.Glob(filepath.Join(os.TempDir(), "isopod-"+strconv.Itoa(os.Getuid()), "*", id)); len(left) > 0 {
			t.Errorf("socket directory of %s left: %v", id, left)
		}
		for _, cg := range []string{"memory", "pids", "cpu", "unified", ""} {
			found, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cg, "*", "*", "isopod", "isopod-*"+id))
			more, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", cg, "isopod", "isopod-*"+id))
			if len(found)+len(more) > 0 {
				t.Errorf("cgroup of %s left: %v %v", id, found, more)
			}
		}
	}
	filepath.WalkDir(e2e.HomeDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		name := d.Name()
		switch {
		case name == "scratch.ext4":
			t.Errorf("scratch disk left: %s", p)
		case strings.HasPrefix(name, ".tmp") && strings.Contains(p, "/stages/"):
			t.Errorf("half stage left: %s", p)
		case strings.HasSuffix(name, ".partial"):
			t.Errorf("partial file left: %s", p)
		}
		return nil
	})
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".part") {
			t.Errorf("copy-out staging file left: %s", e.Name())
		}
	}
}
