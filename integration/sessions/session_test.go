package sessions

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// cold: the sessions here boot cold, so that no test waits on a warm-pool
// snapshot build.
var cold = []string{knobs.WarmPool + "=off"}

// isopod runs a session command that must succeed.
func isopod(t *testing.T, args ...string) *e2e.Result {
	t.Helper()
	r := e2e.Isopod(t, cold, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v failed:\n%s", args, r)
	}
	return r
}

// record is a session's session.json.
type record struct {
	ID              string `json:"id"`
	State           string `json:"state"`
	Reason          string `json:"reason"`
	VMID            string `json:"vm_id"`
	SupervisorPID   int    `json:"supervisor_pid"`
	SupervisorStart uint64 `json:"supervisor_start_time"`
	Path            string `json:"path"`
	GuestIP         string `json:"guest_ip"`
	ResumeMS        int64  `json:"resume_ms"`
	ResumeTotalMS   int64  `json:"resume_total_ms"`
}

func readRecord(t *testing.T, id string) record {
	t.Helper()
	var r record
	b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "sessions", id, "session.json"))
	if err != nil || json.Unmarshal(b, &r) != nil {
		t.Fatalf("session record %s: %v", id, err)
	}
	return r
}

// start starts a cold session with args (the default network unless they
// say otherwise); the test's end stops it.
func start(t *testing.T, args ...string) (id string, rec record) {
	t.Helper()
	return startEnv(t, cold, args...)
}

// startEnv is start with env added to isopod's.
func startEnv(t *testing.T, env []string, args ...string) (id string, rec record) {
	t.Helper()
	t0 := time.Now()
	args = append([]string{"session", "start"}, args...)
	r := e2e.Isopod(t, env, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v failed:\n%s", args, r)
	}
	id = e2e.Str(r.JSON, "session_id")
	if e2e.Str(r.JSON, "state") != "running" || !strings.HasPrefix(id, "ss-") {
		t.Fatalf("session start: %s", r)
	}
	t.Logf("session start: %s wall", time.Since(t0).Round(time.Millisecond))
	rec = readRecord(t, id)
	t.Cleanup(func() {
		e2e.Isopod(t, nil, "session", "stop", id)
		waitGone(t, rec.SupervisorPID, 30*time.Second)
		if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
			t.Errorf("QEMU %v of session %s left behind", pids, id)
			for _, p := range pids {
				unix.Kill(p, unix.SIGKILL)
			}
		}
	})
	return id, rec
}

// waitGone waits, at most d, for process pid to exit; false if it did not.
func waitGone(t *testing.T, pid int, d time.Duration) bool {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return true // gone already
	}
	defer unix.Close(fd)
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	n, _ := unix.Poll(fds, int(d.Milliseconds()))
	return n == 1
}

func exitCode(t *testing.T, r *e2e.Result) int64 { return e2e.Num(t, r.JSON, "exit_code") }

// One session serves a daemon across execs, an exposed port, a background
// job, a timeout that kills only its command, copies both ways, and a stop
// that reports and leaves nothing running.
func TestSessionLifecycle(t *testing.T) {
	e2e.RequireVM(t)
	id, rec := start(t, "--no-network", "--name", "web")
	// Refused before any VM starts: a live session's name, a bad size, a
	// session that does not exist.
	for _, c := range []struct {
		class string
		args  []string
	}{
		{"already_exists", []string{"session", "start", "--no-network", "--name", "web"}},
		{"invalid_argument", []string{"session", "start", "--vcpus", "3"}},
		{"invalid_argument", []string{"session", "start", "--commit-as", "x"}},
		{"not_found", []string{"session", "exec", "nope", "--", "true"}},
	} {
		r := e2e.Isopod(t, cold, c.args...)
		if r.Code != 1 || e2e.Str(r.JSON, "class") != c.class {
			t.Errorf("isopod %v: %s; want %s", c.args, r, c.class)
		}
	}

	r := isopod(t, "session", "exec", "web", "--shell", "--", "echo hi > /tmp/index.html; busybox httpd -p 8000 -h /tmp")
	if exitCode(t, r) != 0 {
		t.Fatalf("starting httpd: %s", r)
	}
	t0 := time.Now()
	r = isopod(t, "session", "exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8000/index.html")
	if exitCode(t, r) != 0 || e2e.Str(r.JSON, "stdout") != "hi\n" {
		t.Fatalf("the daemon did not outlive the exec that started it: %s", r)
	}
	t.Logf("second exec: exec_ms %d, CLI wall %s", e2e.Num(t, r.JSON, "exec_ms"), time.Since(t0).Round(time.Millisecond))
	t0 = time.Now()
	r = isopod(t, "session", "exec", id, "--", "true")
	t.Logf("exec true: exec_ms %d, CLI wall %s", e2e.Num(t, r.JSON, "exec_ms"), time.Since(t0).Round(time.Millisecond))

	// The port, from the host, through the agent channel (no network).
	r = isopod(t, "session", "expose", id, "8000")
	addr := e2e.Str(r.JSON, "address")
	if !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Fatalf("expose: %s", r)
	}
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Get("http://" + addr + "/index.html")
	if err != nil {
		t.Fatalf("fetching through the exposed port: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "hi\n" {
		t.Errorf("through the exposed port: %q; want hi", body)
	}

	// A detached job's output, read later.
	r = isopod(t, "session", "exec", id, "--detach", "--shell", "--", "echo job-out; echo job-err >&2")
	job := e2e.Str(r.JSON, "job_id")
	if job == "" {
		t.Fatalf("detach: %s", r)
	}
	r = isopod(t, "session", "job", id, job, "--wait-s", "30")
	if e2e.Str(r.JSON, "stdout") != "job-out\n" || e2e.Str(r.JSON, "stderr") != "job-err\n" {
		t.Errorf("job output: %s", r)
	}
	r = isopod(t, "session", "jobs", id)
	if jobs, _ := r.JSON["jobs"].([]any); len(jobs) != 1 {
		t.Errorf("jobs: %s; want the one job", r)
	}

	// A timeout kills that command only.
	r = isopod(t, "session", "exec", id, "--timeout-s", "2", "--", "sleep", "60")
	if r.JSON["timed_out"] != true {
		t.Errorf("exec past its timeout: %s", r)
	}
	r = isopod(t, "session", "exec", id, "--", "wget", "-qO-", "http://127.0.0.1:8000/index.html")
	if exitCode(t, r) != 0 || e2e.Str(r.JSON, "stdout") != "hi\n" {
		t.Errorf("after a timeout the session and its daemon still serve: %s", r)
	}

	// cp both ways.
	dir := t.TempDir()
	in := filepath.Join(dir, "in")
	if err := os.WriteFile(in, []byte("copied in\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	isopod(t, "session", "cp", in, id+":/tmp/in")
	r = isopod(t, "session", "exec", id, "--stdin-file", in, "--", "wc", "-c")
	if strings.TrimSpace(e2e.Str(r.JSON, "stdout")) != "10" {
		t.Errorf("exec with --stdin-file: %s", r)
	}
	r = isopod(t, "session", "exec", id, "--shell", "--", "cat /tmp/in; stat -c %a /tmp/in; echo made > /tmp/out")
	if e2e.Str(r.JSON, "stdout") != "copied in\n640\n" {
		t.Errorf("the copied-in file: %s", r)
	}
	out := filepath.Join(dir, "out")
	isopod(t, "session", "cp", "web:/tmp/out", out)
	if b, err := os.ReadFile(out); err != nil || string(b) != "made\n" {
		t.Errorf("copied out: %q, %v", b, err)
	}

	r = isopod(t, "session", "stop", id)
	if e2e.Str(r.JSON, "state") != "stopped" || e2e.Num(t, r.JSON, "execs") != 8 {
		t.Errorf("stop: %s; want stopped after 8 execs", r)
	}
	if _, ok := r.JSON["lifetime_s"].(float64); !ok {
		t.Errorf("stop: no lifetime_s: %s", r)
	}
	if !waitGone(t, rec.SupervisorPID, 10*time.Second) {
		t.Error("the supervisor outlived its stop")
	}
	if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
		t.Errorf("QEMU %v still runs after stop", pids)
	}
	if _, err := os.Stat(filepath.Join(e2e.HomeDir, "sessions", id, "ctl.sock")); !os.IsNotExist(err) {
		t.Errorf("control socket after stop: %v; want it removed", err)
	}
	r = e2e.Isopod(t, nil, "session", "exec", id, "--", "true")
	if r.Code != 1 || e2e.Str(r.JSON, "class") != "failed_precondition" {
		t.Errorf("exec in a stopped session: %s; want a failed precondition", r)
	}
}

// A supervisor killed with -9 takes its VMM with it: the session reads
// lost, and vm gc removes it.
func TestSessionLost(t *testing.T) {
	e2e.RequireVM(t)
	id, rec := start(t)
	vmms := e2e.QEMUPIDs(t, rec.VMID)
	if len(vmms) != 1 {
		t.Fatalf("QEMU of the session: %v; want one", vmms)
	}
	if err := unix.Kill(rec.SupervisorPID, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !waitGone(t, vmms[0], 30*time.Second) {
		t.Fatal("QEMU outlived its supervisor")
	}
	r := isopod(t, "session", "ls")
	var found bool
	for _, s := range r.JSON["sessions"].([]any) {
		m := s.(map[string]any)
		if m["id"] == id {
			found = true
			if m["state"] != "lost" || m["reason"] == "" {
				t.Errorf("session after kill -9: %v; want lost with a reason", m)
			}
		}
	}
	if !found {
		t.Fatalf("session %s not listed: %s", id, r)
	}
	r = isopod(t, "vm", "gc")
	if ss, _ := r.JSON["sessions_removed"].([]any); !slices.Contains(ss, any(id)) {
		t.Errorf("vm gc: %s; want %s removed", r, id)
	}
	if _, err := os.Stat(filepath.Join(e2e.HomeDir, "sessions", id)); !os.IsNotExist(err) {
		t.Errorf("the lost session's directory after gc: %v", err)
	}
}

// A session nobody calls stops at its idle timeout when its idle action
// says so (it pauses by default: TestSessionIdlePause).
func TestSessionIdleTimeout(t *testing.T) {
	e2e.RequireVM(t)
	id, rec := start(t, "--idle-timeout-s", "5", "--idle-action", "stop")
	if !waitGone(t, rec.SupervisorPID, 60*time.Second) {
		t.Fatal("the session outlived its idle timeout")
	}
	got := readRecord(t, id)
	if got.State != "stopped" || !strings.Contains(got.Reason, "idle") {
		t.Errorf("after the idle timeout: %+v; want stopped, idle", got)
	}
	if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
		t.Errorf("QEMU %v still runs after the idle timeout", pids)
	}
}

// With the warm pool on, a session of the default shape resumes from its
// snapshot (built on first use), with the default network, and serves
// execs as a booted one does.
func TestSessionWarm(t *testing.T) {
	e2e.RequireVM(t)
	id, rec := startEnv(t, nil)
	got := readRecord(t, id)
	if got.Path != "warm" || got.GuestIP == "" {
		t.Errorf("session record: %+v; want resumed from the warm pool, with an address", got)
	}
	r := isopod(t, "session", "exec", id, "--shell", "--", "echo hi > /tmp/f && cat /tmp/f")
	if e2e.Str(r.JSON, "stdout") != "hi\n" {
		t.Errorf("exec in a resumed session: %s", r)
	}
	isopod(t, "session", "stop", id)
	if !waitGone(t, rec.SupervisorPID, 10*time.Second) {
		t.Error("the supervisor outlived its stop")
	}
}

// A workspace is copied in at start and is the execs' directory; a
// supervisor told to stop by SIGTERM ends its VM and says why.
func TestSessionWorkspaceAndSIGTERM(t *testing.T) {
	e2e.RequireVM(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, rec := start(t, "--no-network", "--workspace", ws, "--workspace-all")
	r := isopod(t, "session", "exec", id, "--", "cat", "hello.txt")
	if e2e.Str(r.JSON, "stdout") != "from the host\n" {
		t.Errorf("the workspace in the session: %s", r)
	}
	if err := unix.Kill(rec.SupervisorPID, unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !waitGone(t, rec.SupervisorPID, 30*time.Second) {
		t.Fatal("the supervisor outlived SIGTERM")
	}
	got := readRecord(t, id)
	if got.State != "stopped" || !strings.Contains(got.Reason, "signal") {
		t.Errorf("after SIGTERM: %+v; want stopped, signalled", got)
	}
	if pids := e2e.QEMUPIDs(t, rec.VMID); len(pids) != 0 {
		t.Errorf("QEMU %v still runs after SIGTERM", pids)
	}
}
