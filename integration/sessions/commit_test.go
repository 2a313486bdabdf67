package sessions

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// tenMiB writes 10 MiB of random bytes to /data/big.
const tenMiB = "mkdir -p /data && head -c 10485760 /dev/urandom > /data/big"

// A session's filesystem committed while it runs is a stage a run forks:
// it holds what the session's execs wrote up to the commit, its disk
// mounts clean although a job was writing during the commit, and the
// session goes on writing what the stage does not hold.
func TestSessionCommit(t *testing.T) {
	e2e.RequireVM(t)
	id, _ := start(t, "--no-network")
	// A bad label is refused before the session is asked anything.
	for _, label := range []string{"base", "-x", "a b"} {
		r := e2e.Isopod(t, cold, "session", "commit", id, "--as="+label)
		if r.Code != 1 || e2e.Str(r.JSON, "class") != "invalid_argument" || !strings.Contains(e2e.Str(r.JSON, "error"), "--as") {
			t.Errorf("commit --as %q: %s; want invalid_argument naming --as", label, r)
		}
	}
	isopod(t, "session", "exec", id, "--shell", "--", "mkdir -p /data && echo one > /data/one")
	isopod(t, "session", "exec", id, "--shell", "--", tenMiB)
	job := e2e.Str(isopod(t, "session", "exec", id, "--detach", "--shell", "--",
		"i=0; while [ $i -lt 200000 ]; do echo line $i >> /data/busy.log; i=$((i+1)); done").JSON, "job_id")
	// The commit comes once the job is writing (a bounded wait in the guest).
	r := isopod(t, "session", "exec", id, "--shell", "--",
		"for i in $(seq 200); do test -s /data/busy.log && exit 0; sleep 0.05; done; exit 1")
	if exitCode(t, r) != 0 {
		t.Fatalf("the job did not start writing: %s", r)
	}

	t0 := time.Now()
	r = isopod(t, "session", "commit", id, "--as", "sess/one")
	stage := e2e.Str(r.JSON, "stage_id")
	if e2e.Str(r.JSON, "session_id") != id || !strings.HasPrefix(stage, "st-") || e2e.Str(r.JSON, "stage_name") == "" {
		t.Fatalf("commit: %s", r)
	}
	t.Logf("session commit (10 MiB written, a job writing): commit_ms %d (frozen %d, freeze %d, snapshot %d, hash %d, copy %d, reflinked %v), CLI wall %s",
		e2e.Num(t, r.JSON, "commit_ms"), e2e.Num(t, r.JSON, "commit_frozen_ms"), e2e.Num(t, r.JSON, "commit_freeze_ms"), e2e.Num(t, r.JSON, "commit_snapshot_ms"),
		e2e.Num(t, r.JSON, "commit_hash_ms"), e2e.Num(t, r.JSON, "commit_copy_ms"), r.JSON["commit_reflinked"], time.Since(t0).Round(time.Millisecond))
	isopod(t, "session", "job", id, job, "--kill")

	// The stage's disk needs no journal replay and checks clean.
	layer := filepath.Join(e2e.HomeDir, "stages", stage, "layer.ext4")
	if out, err := exec.Command("dumpe2fs", "-h", layer).CombinedOutput(); err != nil || strings.Contains(string(out), "needs_recovery") {
		t.Errorf("the stage's disk needs a journal replay (%v):\n%s", err, out)
	}
	if out, err := exec.Command("e2fsck", "-fn", layer).CombinedOutput(); err != nil {
		t.Errorf("e2fsck of the stage's disk: %v\n%s", err, out)
	}

	// The session goes on; what it writes now is not in the stage.
	r = isopod(t, "session", "exec", id, "--shell", "--", "echo after > /data/after && cat /data/one")
	if exitCode(t, r) != 0 || e2e.Str(r.JSON, "stdout") != "one\n" {
		t.Fatalf("exec after the commit: %s", r)
	}
	r = e2e.Run(t, "--no-network", "--stage", "sess/one", "--", "sh", "-c",
		"cat /data/one; wc -c < /data/big; test -s /data/busy.log && echo busy; test -e /data/after || echo no-after")
	if got := e2e.Str(r.JSON, "stdout"); got != "one\n10485760\nbusy\nno-after\n" {
		t.Errorf("a run from the stage sees %q; want one, the 10 MiB file, the job's log and not /data/after", got)
	}

	// The run path, for comparison: the same 10 MiB committed by a run.
	r = e2e.Run(t, "--no-network", "--commit-as", "run/ten", "--", "sh", "-c", tenMiB)
	t.Logf("run commit (10 MiB written): commit_ms %d (hash %d, copy %d)",
		e2e.Num(t, r.JSON, "commit_ms"), e2e.Num(t, r.JSON, "commit_hash_ms"), e2e.Num(t, r.JSON, "commit_copy_ms"))

	// The session's own figure without a writer: 10 MiB more, then a
	// commit.
	isopod(t, "session", "exec", id, "--shell", "--", strings.Replace(tenMiB, "/data/big", "/data/big2", 1))
	r = isopod(t, "session", "commit", id, "--as", "sess/two")
	t.Logf("session commit (10 MiB written): commit_ms %d (frozen %d, freeze %d, snapshot %d, hash %d, copy %d)",
		e2e.Num(t, r.JSON, "commit_ms"), e2e.Num(t, r.JSON, "commit_frozen_ms"), e2e.Num(t, r.JSON, "commit_freeze_ms"), e2e.Num(t, r.JSON, "commit_snapshot_ms"),
		e2e.Num(t, r.JSON, "commit_hash_ms"), e2e.Num(t, r.JSON, "commit_copy_ms"))
	// With nothing written between, a second commit is still another
	// stage: the freeze and thaw themselves change the filesystem's
	// superblock (its write time and counters).
	a := e2e.Str(r.JSON, "stage_id")
	b := e2e.Str(isopod(t, "session", "commit", id, "--as", "sess/three").JSON, "stage_id")
	if a == b || b == "" {
		t.Errorf("two commits with nothing written between: %s then %s; want two stages", a, b)
	}

	// A session started from a stage commits over it.
	child, _ := start(t, "--no-network", "--stage", "sess/one")
	isopod(t, "session", "exec", child, "--shell", "--", "echo child > /data/child")
	c := e2e.Str(isopod(t, "session", "commit", child, "--as", "sess/child").JSON, "stage_id")
	info := isopod(t, "stage", "info", "sess/child")
	if m, _ := info.JSON["stage"].(map[string]any); e2e.Str(m, "parent") != stage {
		t.Errorf("stage %s: %s; want the parent %s", c, info, stage)
	}
	r = e2e.Run(t, "--no-network", "--stage", "sess/child", "--", "cat", "/data/one", "/data/child")
	if got := e2e.Str(r.JSON, "stdout"); got != "one\nchild\n" {
		t.Errorf("a run from the child stage sees %q", got)
	}
}

// A session with a workspace commits its filesystem without the
// workspace: the stage holds the workspace's mount point (the base lacks
// it), empty, and not what the session wrote in the workspace.
func TestSessionCommitWorkspace(t *testing.T) {
	e2e.RequireVM(t)
	ws := t.TempDir()
	if err := os.WriteFile(filepath.Join(ws, "hello.txt"), []byte("from the host\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	id, _ := start(t, "--no-network", "--workspace", ws, "--workspace-all")
	isopod(t, "session", "exec", id, "--shell", "--", "echo ws > new.txt && mkdir -p /data && echo root > /data/root")
	isopod(t, "session", "commit", id, "--as", "sess/ws")
	r := e2e.Run(t, "--no-network", "--stage", "sess/ws", "--", "sh", "-c", "cat /data/root; test -d /workspace && echo dir; ls -A /workspace; echo end")
	if got := e2e.Str(r.JSON, "stdout"); got != "root\ndir\nend\n" {
		t.Errorf("a run from the stage sees %q; want /data/root and an empty /workspace", got)
	}
	r = isopod(t, "session", "exec", id, "--", "cat", "hello.txt", "new.txt")
	if e2e.Str(r.JSON, "stdout") != "from the host\nws\n" {
		t.Errorf("the workspace after the commit: %s", r)
	}
}

// A session resumed from the warm pool commits as a booted one does.
func TestSessionCommitWarm(t *testing.T) {
	e2e.RequireVM(t)
	id, _ := startEnv(t, nil)
	if got := readRecord(t, id); got.Path != "warm" {
		t.Fatalf("session record: %+v; want resumed from the warm pool", got)
	}
	isopod(t, "session", "exec", id, "--shell", "--", "mkdir -p /data && echo warm > /data/warm")
	isopod(t, "session", "commit", id, "--as", "sess/warm")
	r := e2e.Run(t, "--no-network", "--stage", "sess/warm", "--", "cat", "/data/warm")
	if got := e2e.Str(r.JSON, "stdout"); got != "warm\n" {
		t.Errorf("a run from the warm session's stage sees %q", got)
	}
}
