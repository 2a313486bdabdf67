package sessions

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// counter counts in the guest, writing its pid and count to /tmp; the
// count is renamed into place, so that no reader finds it truncated.
const counter = `echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/c.new; mv /tmp/c.new /tmp/c; sleep 0.2; done`

// guestInts runs a shell line in session id and returns the integers it
// prints, and whether the call resumed the session.
func guestInts(t *testing.T, id, line string) ([]int64, bool) {
	t.Helper()
	r := isopod(t, "session", "exec", id, "--shell", "--", line)
	var out []int64
	for _, f := range strings.Fields(e2e.Str(r.JSON, "stdout")) {
		n, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			t.Fatalf("exec %q: %s", line, r)
		}
		out = append(out, n)
	}
	return out, r.JSON["resumed"] == true
}

// pause pauses session id and checks that its supervisor and QEMU are
// gone and its record reads paused.
func pause(t *testing.T, id string) *e2e.Result {
	t.Helper()
	rec := readRecord(t, id)
	r := isopod(t, "session", "pause", id)
	if e2e.Str(r.JSON, "state") != "paused" || e2e.Num(t, r.JSON, "memory_bytes") <= 0 {
		t.Fatalf("pause: %s", r)
	}
	t.Logf("pause: pause_ms %d, memory_bytes %d, disk_bytes %d", e2e.Num(t, r.JSON, "pause_ms"),
		e2e.Num(t, r.JSON, "memory_bytes"), e2e.Num(t, r.JSON, "disk_bytes"))
	if !waitGone(t, rec.SupervisorPID, 10*time.Second) {
		t.Errorf("the supervisor %d of paused session %s still runs", rec.SupervisorPID, id)
	}
	if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
		t.Errorf("paused session %s keeps QEMU %v", id, pids)
	}
	if st := readRecord(t, id).State; st != "paused" {
		t.Errorf("record after pause: %s; want paused", st)
	}
	return r
}

// A paused session's VM holds no process; an exec resumes it with its
// processes (a counter that kept its pid and counts on), a job started
// before the pause, and the host's clock; it pauses and resumes again.
func TestSessionPauseResume(t *testing.T) {
	e2e.RequireVM(t)
	id, _ := start(t, "--mem-mib", "512")
	r := isopod(t, "session", "exec", id, "--detach", "--shell", "--", counter)
	job := e2e.Str(r.JSON, "job_id")
	var before []int64
	for deadline := time.Now().Add(20 * time.Second); len(before) < 2 && time.Now().Before(deadline); {
		before, _ = guestInts(t, id, "cat /tmp/pid /tmp/c 2>/dev/null; true")
	}
	if len(before) < 2 {
		t.Fatal("the counter did not start")
	}
	pause(t, id)
	r = e2e.Isopod(t, cold, "session", "ls")
	if !strings.Contains(string(r.Stdout), `"state":"paused"`) {
		t.Errorf("session ls after pause: %s; want it paused", r)
	}
	after, resumed := guestInts(t, id, "cat /tmp/pid /tmp/c; date +%s")
	if !resumed {
		t.Error("the exec on a paused session did not say resumed")
	}
	if len(after) != 3 || after[0] != before[0] || after[1] < before[1] {
		t.Fatalf("after resume: pid, count %v; before %v: want the same pid counting on", after, before)
	}
	if skew := after[2] - time.Now().Unix(); skew < -5 || skew > 5 {
		t.Errorf("the guest clock is %d s off the host's after the resume", skew)
	}
	later, resumed := guestInts(t, id, "sleep 1; cat /tmp/c")
	if resumed || len(later) != 1 || later[0] <= after[1] {
		t.Errorf("count a second later: %v (resumed %v); want more than %d", later, resumed, after[1])
	}
	r = isopod(t, "session", "job", id, job)
	if e2e.Str(r.JSON["job"].(map[string]any), "id") != job {
		t.Errorf("the job started before the pause: %s", r)
	}
	// A resumed VM pauses again, and resume says so.
	pause(t, id)
	r = isopod(t, "session", "resume", id)
	if r.JSON["resumed"] != true || e2e.Num(t, r.JSON, "resume_ms") <= 0 || e2e.Str(r.JSON, "state") != "running" {
		t.Errorf("resume: %s", r)
	}
	t.Logf("resume: resume_ms %d", e2e.Num(t, r.JSON, "resume_ms"))
	again, _ := guestInts(t, id, "cat /tmp/pid")
	if len(again) != 1 || again[0] != before[0] {
		t.Errorf("after the second resume the counter's pid is %v; want %d", again, before[0])
	}
	// Execs that find the session paused at once take turns: one resumes
	// it, the others find it running.
	pause(t, id)
	rs := e2e.Parallel(3, func(int) *e2e.Result { return e2e.Isopod(t, cold, "session", "exec", id, "--", "cat", "/tmp/pid") })
	resumes := 0
	for _, r := range rs {
		if r.Code != 0 || strings.TrimSpace(e2e.Str(r.JSON, "stdout")) != strconv.FormatInt(before[0], 10) {
			t.Errorf("a concurrent exec on the paused session: %s", r)
		}
		if r.JSON["resumed"] == true {
			resumes++
		}
	}
	if resumes != 1 {
		t.Errorf("%d of 3 concurrent execs resumed the session; want 1", resumes)
	}
}

// The idle timeout pauses a session; the next exec resumes it, and its
// exposed port is relayed again on the same address.
func TestSessionIdlePause(t *testing.T) {
	e2e.RequireVM(t)
	id, rec := start(t, "--no-network", "--idle-timeout-s", "2")
	isopod(t, "session", "exec", id, "--shell", "--", "echo kept > /tmp/f; echo hi > /tmp/index.html; busybox httpd -p 8000 -h /tmp")
	addr := e2e.Str(isopod(t, "session", "expose", id, "8000").JSON, "address")
	if !waitGone(t, rec.SupervisorPID, 30*time.Second) {
		t.Fatal("the session did not go idle")
	}
	if r := readRecord(t, id); r.State != "paused" || !strings.Contains(r.Reason, "idle") {
		t.Fatalf("after the idle timeout: %+v; want paused", r)
	}
	r := isopod(t, "session", "exec", id, "--", "cat", "/tmp/f")
	if r.JSON["resumed"] != true || e2e.Str(r.JSON, "stdout") != "kept\n" {
		t.Errorf("exec after the idle pause: %s; want resumed, the file kept", r)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + addr + "/index.html")
	if err != nil {
		t.Fatalf("the exposed port after the resume: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi\n" {
		t.Errorf("through the exposed port after the resume: %q; want hi", body)
	}
}

// A paused session whose snapshot's VMM changed reads lost, in ls and on
// resume.
func TestSessionPausedChanged(t *testing.T) {
	e2e.RequireVM(t)
	id, _ := start(t, "--no-network")
	pause(t, id)
	path := filepath.Join(e2e.HomeDir, "sessions", id, "paused", "paused.json")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var desc map[string]any
	json.Unmarshal(b, &desc)
	desc["identity"].(map[string]any)["vmm"] = "qemu of another build"
	b, _ = json.Marshal(desc)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	e2e.Isopod(t, cold, "session", "ls")
	if r := readRecord(t, id); r.State != "lost" || !strings.Contains(r.Reason, "VMM changed") {
		t.Errorf("after ls: %+v; want lost, the VMM changed", r)
	}
	r := e2e.Isopod(t, cold, "session", "resume", id)
	if r.Code != 1 || e2e.Str(r.JSON, "class") != "failed_precondition" {
		t.Errorf("resume of a lost session: %s; want failed_precondition", r)
	}
}

// A pause over the paused sessions' disk budget is refused, naming the
// setting, and the session keeps running.
func TestSessionPauseBudget(t *testing.T) {
	e2e.RequireVM(t)
	id, _ := startEnv(t, append([]string{knobs.SessionDiskBudgetMiB + "=1"}, cold...), "--no-network")
	r := e2e.Isopod(t, cold, "session", "pause", id)
	if r.Code != 1 || e2e.Str(r.JSON, "class") != "resource_exhausted" || !strings.Contains(e2e.Str(r.JSON, "error"), knobs.SessionDiskBudgetMiB) {
		t.Fatalf("pause over the budget: %s; want resource_exhausted naming %s", r, knobs.SessionDiskBudgetMiB)
	}
	r = isopod(t, "session", "exec", id, "--", "true")
	if r.JSON["resumed"] == true || readRecord(t, id).State != "running" {
		t.Errorf("after a refused pause: %s; want it running", r)
	}
}

// A session resumed from the warm pool has RAM of its own: it pauses and
// resumes like a cold one, and runs are not changed by it.
func TestSessionWarmPause(t *testing.T) {
	e2e.RequireVM(t)
	// The first warm start builds the shape's snapshot.
	id, _ := startEnv(t, nil, "--no-network")
	if p := readRecord(t, id).Path; p != "warm" {
		t.Skipf("the session booted %s, not from the warm pool", p)
	}
	isopod(t, "session", "exec", id, "--shell", "--", "echo kept > /tmp/f")
	pause(t, id)
	r := isopod(t, "session", "exec", id, "--", "cat", "/tmp/f")
	if r.JSON["resumed"] != true || e2e.Str(r.JSON, "stdout") != "kept\n" {
		t.Errorf("exec after the pause: %s; want resumed, the file kept", r)
	}
	r = e2e.Isopod(t, nil, "run", "--no-network", "--", "true")
	if r.Code != 0 || e2e.Str(r.JSON, "path") != "warm" {
		t.Errorf("a run beside the session: %s; want warm", r)
	}
}

// guestOut runs a shell line in session id and returns its stdout.
func guestOut(t *testing.T, id, line string) string {
	t.Helper()
	return e2e.Str(isopod(t, "session", "exec", id, "--shell", "--", line).JSON, "stdout")
}

// fork forks session parent; the test's end stops the fork.
func fork(t *testing.T, parent string) string {
	t.Helper()
	t0 := time.Now()
	r := isopod(t, "session", "fork", parent)
	id := e2e.Str(r.JSON, "session_id")
	if e2e.Str(r.JSON, "state") != "running" || id == parent || r.JSON["resumed"] != true {
		t.Fatalf("fork: %s", r)
	}
	t.Logf("fork: resume_ms %d, CLI wall %s", e2e.Num(t, r.JSON, "resume_ms"), time.Since(t0).Round(time.Millisecond))
	rec := readRecord(t, id)
	t.Cleanup(func() {
		e2e.Isopod(t, nil, "session", "stop", id)
		waitGone(t, readRecord(t, id).SupervisorPID, 30*time.Second)
		if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
			t.Errorf("QEMU %v of fork %s left behind", pids, id)
		}
	})
	return id
}

// A fork of a running session, and one of a paused session, carry its
// files and processes and then diverge: each has its own boot id and
// entropy, and what one writes the other does not see. The running
// parent runs on; the paused one stays paused.
func TestSessionFork(t *testing.T) {
	e2e.RequireVM(t)
	parent, _ := start(t, "--no-network")
	const probe = "cat /proc/sys/kernel/random/boot_id; head -c16 /dev/urandom | od -An -tx1; cat /tmp/pid"
	isopod(t, "session", "exec", parent, "--detach", "--shell", "--", counter)
	// The kernel fixes its boot id at its first read: before the fork.
	isopod(t, "session", "exec", parent, "--shell", "--", "echo before > /tmp/before; cat /proc/sys/kernel/random/boot_id; sleep 0.5")
	child := fork(t, parent)
	p, c := strings.Fields(guestOut(t, parent, probe)), strings.Fields(guestOut(t, child, probe))
	if len(p) != 18 || len(c) != 18 {
		t.Fatalf("probe: parent %q, fork %q", p, c)
	}
	if p[0] == c[0] {
		t.Errorf("the fork shares its parent's boot id %s", p[0])
	}
	if strings.Join(p[1:17], "") == strings.Join(c[1:17], "") {
		t.Error("the fork draws its parent's random bytes")
	}
	if p[17] != c[17] {
		t.Errorf("the fork's counter has pid %s, its parent's %s; want the same process copied", c[17], p[17])
	}
	if got := guestOut(t, child, "cat /tmp/before"); got != "before\n" {
		t.Errorf("the fork lacks its parent's file: %q", got)
	}
	guestOut(t, child, "echo fork > /tmp/fork-only")
	guestOut(t, parent, "echo parent > /tmp/parent-only")
	if got := guestOut(t, parent, "ls /tmp/fork-only 2>&1; true"); !strings.Contains(got, "No such file") {
		t.Errorf("the parent sees the fork's file: %q", got)
	}
	if got := guestOut(t, child, "ls /tmp/parent-only 2>&1; true"); !strings.Contains(got, "No such file") {
		t.Errorf("the fork sees its parent's later file: %q", got)
	}
	// A paused parent forks, and stays paused.
	pause(t, parent)
	child2 := fork(t, parent)
	if st := readRecord(t, parent).State; st != "paused" {
		t.Errorf("the paused parent is %s after its fork; want paused", st)
	}
	c2 := strings.Fields(guestOut(t, child2, probe))
	if len(c2) != 18 || c2[0] == p[0] || c2[0] == c[0] || c2[17] != p[17] {
		t.Errorf("fork of the paused parent: %q; want its own boot id, the counter's pid %s", c2, p[17])
	}
	if got := guestOut(t, child2, "cat /tmp/parent-only"); got != "parent\n" {
		t.Errorf("the fork of the paused parent lacks its file: %q", got)
	}
	// A paused session stops without resuming; what its pause kept goes.
	prec := readRecord(t, parent)
	scratch := filepath.Join(e2e.HomeDir, "vms", prec.VMID, "scratch.ext4")
	if _, err := os.Stat(scratch); err != nil {
		t.Errorf("the paused session's scratch disk: %v; want it kept", err)
	}
	r := isopod(t, "session", "stop", parent)
	if e2e.Str(r.JSON, "state") != "stopped" {
		t.Errorf("stop of the paused parent: %s", r)
	}
	for _, p := range []string{filepath.Join(e2e.HomeDir, "sessions", parent, "paused"), scratch} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after stopping the paused session: %v; want it removed", p, err)
		}
	}
}

// A fork of a session with a workspace has a copy of its own: what one
// writes there the other does not see, and the parent's end leaves the
// fork's copy; both pause and resume with it.
func TestSessionForkWorkspace(t *testing.T) {
	e2e.RequireVM(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "a"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	parent, _ := start(t, "--no-network", "--workspace", ws, "--workspace-all")
	child := fork(t, parent)
	guestOut(t, child, "echo fork > b")
	if got := guestOut(t, parent, "cat a; ls b 2>&1; true"); !strings.HasPrefix(got, "from the host\n") || !strings.Contains(got, "No such file") {
		t.Errorf("the parent's workspace: %q; want its file and not the fork's", got)
	}
	isopod(t, "session", "stop", parent)
	pause(t, child)
	if got := guestOut(t, child, "cat a b"); got != "from the host\nfork\n" {
		t.Errorf("the fork's workspace after its parent stopped and it paused: %q", got)
	}
}
