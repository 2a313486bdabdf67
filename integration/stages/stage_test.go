package stages

import (
	"isopod/integration/e2e"

	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// label makes a label unique to this test run, so that stages left by an
// earlier run of the suite never collide.
func label(t testing.TB, name string) string {
	return fmt.Sprintf("e2e-%s-%d/%s", strings.ToLower(t.Name()), os.Getpid(), name)
}

func stageInfo(t testing.TB, ref string) map[string]any {
	t.Helper()
	r := e2e.Isopod(t, nil, "stage", "info", ref)
	if r.Code != 0 {
		t.Fatalf("stage info %s:\n%s", ref, r)
	}
	return r.JSON
}

// rmStages removes stages leaf first at the end of a test.
func rmStages(t testing.TB, refs ...string) {
	t.Cleanup(func() {
		for i := len(refs) - 1; i >= 0; i-- {
			e2e.Isopod(t, nil, "stage", "rm", refs[i])
		}
	})
}

func TestStageCommitForkStack(t *testing.T) {
	e2e.RequireVM(t)
	one, two := label(t, "one"), label(t, "two")
	rmStages(t, one, two)

	r := e2e.Run(t, "--no-network", "--commit-as", one, "--", "sh", "-c", "echo first > /root/one.txt && echo gone > /root/gone.txt")
	id := e2e.Str(r.JSON, "stage_id")
	if !strings.HasPrefix(id, "st-") || e2e.Str(r.JSON, "stage_name") == "" {
		t.Fatalf("no stage in report: %s", r.Stdout)
	}
	for _, k := range []string{"commit_ms", "commit_hash_ms", "commit_copy_ms"} {
		e2e.Num(t, r.JSON, k)
	}
	info := stageInfo(t, one)
	layers := info["layer_paths"].([]any)
	parentLayer := layers[0].(string)
	before := e2e.FileSHA(t, parentLayer)

	r = e2e.Run(t, "--no-network", "--stage", one, "--", "cat", "/root/one.txt")
	if e2e.Str(r.JSON, "stdout") != "first\n" {
		t.Errorf("fork does not see the committed file: %q", e2e.Str(r.JSON, "stdout"))
	}
	// Stack a second layer: add, change and remove.
	r = e2e.Run(t, "--no-network", "--stage", one, "--commit-as", two, "--",
		"sh", "-c", "echo second > /root/two.txt && echo changed >> /root/one.txt && rm /root/gone.txt")
	if e2e.Str(r.JSON, "stage_id") == "" {
		t.Fatalf("stacked commit: %s", r.Stdout)
	}
	r = e2e.Run(t, "--no-network", "--stage", two, "--", "sh", "-c", "cat /root/one.txt /root/two.txt; test -e /root/gone.txt && echo still-there")
	if got := e2e.Str(r.JSON, "stdout"); got != "first\nchanged\nsecond\n" {
		t.Errorf("fork of the stack sees %q", got)
	}
	if after := e2e.FileSHA(t, parentLayer); after != before {
		t.Errorf("parent layer changed: %s -> %s", before, after)
	}
	if chain := stageInfo(t, two)["layer_paths"].([]any); len(chain) != 2 {
		t.Errorf("stacked chain: %v", chain)
	}

	// stage log: base to tip, each layer with its command.
	lg := e2e.Isopod(t, nil, "stage", "log", two)
	if ls, _ := lg.JSON["layers"].([]any); len(ls) != 2 || !strings.Contains(string(lg.Stdout), "two.txt") {
		t.Errorf("stage log: %s", lg.Stdout)
	} else {
		// Each layer: the command that made it, when, and its size.
		for i, l := range ls {
			m, _ := l.(map[string]any)
			if argv, _ := m["argv"].([]any); len(argv) == 0 || m["created"] == "" || m["created"] == nil || m["allocated_bytes"] == nil || m["size_bytes"] == nil {
				t.Errorf("stage log layer %d lacks argv, created or size: %v", i, m)
			}
		}
	}
	// stage diff: one added, one changed, one removed file.
	d := e2e.Isopod(t, nil, "stage", "diff", one, two)
	if d.Code != 0 {
		t.Fatalf("stage diff:\n%s", d)
	}
	has := func(kind, path string) bool {
		list, _ := d.JSON[kind].([]any)
		for _, e := range list {
			if m, _ := e.(map[string]any); m["path"] == path || m["path"] == strings.TrimPrefix(path, "/") {
				return true
			}
		}
		return false
	}
	if !has("added", "/root/two.txt") || !has("changed", "/root/one.txt") || !has("removed", "/root/gone.txt") {
		t.Errorf("stage diff: %s", d.Stdout)
	}

	// rm of a parent is refused while the child exists.
	e2e.RunFail(t, nil, two, "stage", "rm", one)
}

func TestStageFailingCommandCommitsNothing(t *testing.T) {
	e2e.RequireVM(t)
	l := label(t, "fail")
	r := e2e.Run(t, "--no-network", "--commit-as", l, "--", "sh", "-c", "echo x > /root/x; exit 1")
	if e2e.Str(r.JSON, "stage_id") != "" {
		t.Errorf("exit 1 committed %s", e2e.Str(r.JSON, "stage_id"))
	}
	wantNothingCommitted(t, r)
	r = e2e.Run(t, "--no-network", "--timeout-s", "5", "--commit-as", l, "--", "sleep", "100")
	if r.JSON["timed_out"] != true || e2e.Str(r.JSON, "stage_id") != "" {
		t.Errorf("timeout committed: %s", r.Stdout)
	}
	wantNothingCommitted(t, r)
	// A timeout that ends the run before the guest is ready (one second is
	// less than a boot under emulation) warns the same way.
	r = e2e.Run(t, "--no-network", "--timeout-s", "1", "--commit-as", l, "--", "sleep", "100")
	if r.JSON["timed_out"] != true || e2e.Str(r.JSON, "stage_id") != "" {
		t.Errorf("timeout committed: %s", r.Stdout)
	}
	wantNothingCommitted(t, r)
	if r := e2e.Isopod(t, nil, "stage", "info", l); r.Code == 0 {
		t.Errorf("a stage exists after failed runs: %s", r.Stdout)
	}
}

// wantNothingCommitted checks that the report warns that --commit-as did
// not commit.
func wantNothingCommitted(t *testing.T, r *e2e.Result) {
	t.Helper()
	warns, _ := r.JSON["warnings"].([]any)
	for _, w := range warns {
		if s, _ := w.(string); strings.HasPrefix(s, "nothing committed") {
			return
		}
	}
	t.Errorf("no \"nothing committed\" warning in %v", r.JSON["warnings"])
}

func TestStageParallelForksAndLabelRace(t *testing.T) {
	e2e.RequireVM(t)
	parent := label(t, "parent")
	rmStages(t, parent)
	e2e.Run(t, "--no-network", "--commit-as", parent, "--", "sh", "-c", "echo p > /root/p")
	layer := stageInfo(t, parent)["layer_paths"].([]any)[0].(string)
	before := e2e.FileSHA(t, layer)

	forks := e2e.Parallel(4, func(int) *e2e.Result {
		return e2e.Isopod(t, nil, "run", "--no-network", "--stage", parent, "--", "sh", "-c", "cat /root/p; echo mine > /root/p")
	})
	for i, r := range forks {
		if r.Code != 0 || e2e.Str(r.JSON, "stdout") != "p\n" {
			t.Errorf("fork %d:\n%s", i, r)
		}
	}
	if after := e2e.FileSHA(t, layer); after != before {
		t.Errorf("parallel forks changed the parent layer")
	}

	// Two commits racing on one label: exactly one wins.
	race := label(t, "race")
	rmStages(t, race)
	results := e2e.Parallel(2, func(i int) *e2e.Result {
		return e2e.Isopod(t, nil, "run", "--no-network", "--commit-as", race, "--", "sh", "-c", "echo "+e2e.Itoa(int64(i))+" > /root/r")
	})
	won := 0
	for _, r := range results {
		if r.Code == 0 && e2e.Str(r.JSON, "stage_id") != "" {
			won++
		} else if r.Code != 0 || e2e.Str(r.JSON, "stage_id") != "" || !strings.Contains(e2e.Str(r.JSON, "commit_error"), "label") {
			// The command itself succeeded: the report stays, and says
			// why nothing was committed.
			t.Errorf("the losing commit should report a commit_error naming the label:\n%s", r)
		}
	}
	if won != 1 {
		t.Errorf("%d commits won the race; want 1", won)
	}
	ents, _ := os.ReadDir(filepath.Join(e2e.HomeDir, "stages"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".tmp") {
			if _, err := os.Stat(filepath.Join(e2e.HomeDir, "stages", e.Name(), "meta.json")); err == nil {
				t.Errorf("partial stage directory left: %s", e.Name())
			}
		}
	}
}

func TestStageDepthLimit(t *testing.T) {
	e2e.RequireVM(t)
	var labels []string
	prev := "base"
	for i := 0; i < 10; i++ {
		l := label(t, "d"+e2e.Itoa(int64(i)))
		labels = append(labels, l)
		r := e2e.Isopod(t, nil, "run", "--no-network", "--stage", prev, "--commit-as", l, "--", "sh", "-c", "echo "+e2e.Itoa(int64(i))+" > /root/d"+e2e.Itoa(int64(i)))
		if r.Code != 0 {
			rmStages(t, labels[:i]...)
			t.Fatalf("layer %d:\n%s", i, r)
		}
		prev = l
	}
	rmStages(t, labels...)
	r := e2e.Run(t, "--no-network", "--stage", prev, "--", "sh", "-c", "cat /root/d0 /root/d9")
	if e2e.Str(r.JSON, "stdout") != "0\n9\n" {
		t.Errorf("a 10-layer fork sees %q", e2e.Str(r.JSON, "stdout"))
	}
	e2e.RunFail(t, nil, "limit is 10", "run", "--no-network", "--stage", prev, "--commit-as", label(t, "d10"), "--", "true")
}

func TestStageRebuiltBaseRefused(t *testing.T) {
	e2e.RequireVM(t)
	// A state root of its own whose base-min is then rebuilt with different
	// content: forks must refuse, naming both ids, unless skew is allowed.
	home := t.TempDir()
	os.MkdirAll(filepath.Join(home, "images"), 0o700)
	os.Symlink(filepath.Join(e2e.HomeDir, "kernels"), filepath.Join(home, "kernels"))
	for _, f := range []string{"base-min.sqfs", "base-min.json", "initramfs.cpio", "initramfs.json"} {
		b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "images", f))
		if err != nil {
			t.Fatal(err)
		}
		os.WriteFile(filepath.Join(home, "images", f), b, 0o600)
	}
	env := []string{"ISOPOD_HOME=" + home}
	r := e2e.Isopod(t, env, "run", "--no-network", "--commit-as", "skew/deps", "--", "sh", "-c", "echo dep > /root/dep")
	if r.Code != 0 {
		t.Fatalf("commit:\n%s", r)
	}
	oldSHA := e2e.Str(r.JSON, "base_sha256")
	// "Rebuild" the base: new content, new content id in its sidecar.
	sqfs := filepath.Join(home, "images", "base-min.sqfs")
	f, _ := os.OpenFile(sqfs, os.O_WRONLY|os.O_APPEND, 0)
	f.Write(make([]byte, 4096))
	f.Close()
	newSHA := e2e.FileSHA(t, sqfs)
	side, _ := os.ReadFile(filepath.Join(home, "images", "base-min.json"))
	side = []byte(strings.ReplaceAll(string(side), oldSHA, newSHA))
	st, _ := os.Stat(sqfs)
	side = []byte(replaceSize(string(side), st.Size()))
	os.WriteFile(filepath.Join(home, "images", "base-min.json"), side, 0o600)

	fail := e2e.RunFail(t, env, oldSHA, "run", "--no-network", "--stage", "skew/deps", "--", "cat", "/root/dep")
	msg := e2e.Str(fail.JSON, "error")
	for _, want := range []string{newSHA, "ISOPOD_ALLOW_BASE_SKEW=1", "--stage base"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not mention %q", msg, want)
		}
	}
	r = e2e.Isopod(t, append(env, "ISOPOD_ALLOW_BASE_SKEW=1"), "run", "--no-network", "--stage", "skew/deps", "--", "cat", "/root/dep")
	if r.Code != 0 || e2e.Str(r.JSON, "stdout") != "dep\n" {
		t.Errorf("with ISOPOD_ALLOW_BASE_SKEW=1:\n%s", r)
	}
}

// replaceSize rewrites the "size" field of an image sidecar.
func replaceSize(side string, size int64) string {
	i := strings.Index(side, `"size":`)
	if i < 0 {
		return side
	}
	j := i + len(`"size":`)
	for j < len(side) && (side[j] == ' ' || (side[j] >= '0' && side[j] <= '9')) {
		j++
	}
	return side[:i] + `"size": ` + e2e.Itoa(size) + side[j:]
}
