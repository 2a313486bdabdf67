package warmpool

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// A shape that recurs resumes from a snapshot whose root is already
// assembled (README "Warm pool"): built ahead with `warmpool build
// --stage`, or inside the third run of a stage chain; each clone writes to
// a scratch disk of its own and sees its stage's files; a commit from such
// a clone is a stage like any; a removed stage takes its assembled
// snapshot along, and the disk budget evicts one like any snapshot.
func TestAssembledRoot(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	home := strings.TrimPrefix(env[0], "ISOPOD_HOME=")
	c := newClones()
	assembled := func(t *testing.T, r *e2e.Result, want bool) {
		t.Helper()
		if got := r.JSON["root_assembled"] == true; got != want {
			t.Errorf("root_assembled %v; want %v\n%s", got, want, r.Stdout)
		}
	}
	commit := func(t *testing.T, label string, args []string, cmd string) *e2e.Result {
		t.Helper()
		r := warmRun(t, env, append(append(args, "--commit-as", label, "--"), hygienic(cmd)...)...)
		if e := e2e.Str(r.JSON, "commit_error"); e != "" || e2e.Str(r.JSON, "stage_id") == "" {
			t.Fatalf("commit %s: not committed (%s):\n%s", label, e, r.Stdout)
		}
		return r
	}
	// The home's first run: it builds the plain snapshot and runs on in
	// its VM, its scratch disk in the scratch slot; the layer it commits
	// is the scratch disk at its own size.
	first := commit(t, "asm-s", nil, "echo s > /etc/asm-s")
	wantPath(t, first, "cold", true)
	layer := stageLayer(t, env, "asm-s")
	if st, err := os.Stat(layer); err != nil || st.Size() != 1024<<20 {
		t.Errorf("the first run's layer %s: %v, %v; want the 1024 MiB scratch disk", layer, st, err)
	}
	if got := layerID(t, layer, "", "base-min"); got != e2e.Str(first.JSON, "stage_id") {
		t.Errorf("the first run's layer hashes to %s; its stage id is %s", got, e2e.Str(first.JSON, "stage_id"))
	}

	var asmDir string
	t.Run("warmpool build --stage, then clones of their own", func(t *testing.T) {
		b := ok(t, env, "warmpool", "build", "--stage", "asm-s")
		if b["built"] != true || b["root_assembled"] != true {
			t.Fatalf("warmpool build --stage asm-s: %v; want an assembled snapshot built", b)
		}
		asmDir = e2e.Str(b, "path")
		scratch := filepath.Join(asmDir, "scratch.ext4")
		before := e2e.FileSHA(t, scratch)
		for i := range 2 {
			r, out := c.run(t, env, "assembled clone "+strconv.Itoa(i), "warm", false, []string{"--stage", "asm-s"},
				"cat /etc/asm-s; ls /root; echo "+strconv.Itoa(i)+" > /root/w"+strconv.Itoa(i))
			assembled(t, r, true)
			if out != "s\n" {
				t.Errorf("clone %d printed %q; want the stage's file and no other clone's write", i, out)
			}
		}
		if after := e2e.FileSHA(t, scratch); after != before {
			t.Errorf("the snapshot's scratch image changed after clones wrote (%s -> %s)", before, after)
		}
	})

	t.Run("a commit from an assembled clone is a stage like any", func(t *testing.T) {
		r := commit(t, "asm-c", []string{"--stage", "asm-s"}, "echo c > /etc/asm-c")
		assembled(t, r, true)
		_, out := c.run(t, env, "fork of asm-c", "warm", false, []string{"--stage", "asm-c"}, "cat /etc/asm-s /etc/asm-c")
		if out != "s\nc\n" {
			t.Errorf("a fork of the stage committed from an assembled clone printed %q; want s and c", out)
		}
		if got := layerID(t, stageLayer(t, env, "asm-c"), e2e.Str(r.JSON, "forked_from"), "base-min"); got != e2e.Str(r.JSON, "stage_id") {
			t.Errorf("the committed layer's bytes hash to %s; the stage id is %s", got, e2e.Str(r.JSON, "stage_id"))
		}
	})

	t.Run("a chain used twice builds in its next run; stage rm removes it", func(t *testing.T) {
		// asm-c ran once above (its fork).
		r, _ := c.run(t, env, "asm-c run 2", "warm", false, []string{"--stage", "asm-c"}, "true")
		assembled(t, r, false)
		// The run that builds the snapshot runs on in its VM: what it
		// writes and commits is its own, and no later clone sees it.
		r, out := c.run(t, env, "asm-c run 3", "warm", true, []string{"--stage", "asm-c", "--commit-as", "asm-d"},
			"cat /etc/asm-c; echo d > /etc/asm-d; echo 3 > /root/w3")
		assembled(t, r, true)
		if out != "c\n" || e2e.Str(r.JSON, "stage_id") == "" {
			t.Errorf("the run that built asm-c's assembled snapshot printed %q, committed %q (%s)", out, e2e.Str(r.JSON, "stage_id"), e2e.Str(r.JSON, "commit_error"))
		}
		r, out = c.run(t, env, "asm-c run 4", "warm", false, []string{"--stage", "asm-c"}, "cat /etc/asm-c; ls /root; test -e /etc/asm-d && echo asm-d; true")
		assembled(t, r, true)
		if out != "c\n" {
			t.Errorf("a clone of asm-c's assembled snapshot printed %q; want the stage's file and nothing the builder's run wrote", out)
		}
		if _, out := c.run(t, env, "fork of asm-d", "warm", false, []string{"--stage", "asm-d"}, "cat /etc/asm-d /root/w3"); out != "d\n3\n" {
			t.Errorf("a fork of the stage the builder's run committed printed %q; want d and 3", out)
		}
		ok(t, env, "stage", "rm", "asm-d")
		n := len(snapshotDirs(t, env))
		ok(t, env, "stage", "rm", "asm-c")
		if got := len(snapshotDirs(t, env)); got != n-1 {
			t.Errorf("%d snapshots after stage rm asm-c, %d before; want its assembled one removed", got, n)
		}
	})

	t.Run("the budget evicts an assembled snapshot like any", func(t *testing.T) {
		if asmDir == "" {
			t.Skip("no assembled snapshot")
		}
		b := ok(t, append([]string{"ISOPOD_WARM_POOL_DISK_MIB=1"}, env...), "warmpool", "build", "--stage", "base")
		if b["built"] != true || b["root_assembled"] != true {
			t.Fatalf("warmpool build --stage base: %v", b)
		}
		if _, err := os.Stat(asmDir); err == nil {
			t.Errorf("asm-s's assembled snapshot outlived a build over the budget")
		}
		if d := snapshotDirs(t, env); len(d) != 1 || filepath.Join(home, "snapshots", d[0]) != e2e.Str(b, "path") {
			t.Errorf("snapshots %v; want only the one just built", d)
		}
	})
}

// The MCP server builds a recurring shape's assembled snapshot in the
// background after its second call; the third resumes from it (no ready
// VMs here: they would serve it first).
func TestMCPAssembledRoot(t *testing.T) {
	e2e.RequireVM(t)
	env := append(warmHome(t), "ISOPOD_READY_VMS=0")
	s := startMCP(t, env)
	c := newClones()
	rep, _ := s.run(t, c, "first call", nil, "true")
	if rep["path"] != "cold" {
		t.Errorf("first call: path %v; want cold, its snapshot built after it", rep["path"])
	}
	waitFor(t, "the plain snapshot", 5*time.Minute, func() bool { return len(listSnapshots(t, env)) == 1 })
	rep, _ = s.run(t, c, "second call", nil, "true")
	if rep["path"] != "warm" || rep["snapshot_built"] == true || rep["root_assembled"] == true {
		t.Errorf("second call: path %v snapshot_built %v root_assembled %v; want a plain resume", rep["path"], rep["snapshot_built"], rep["root_assembled"])
	}
	waitFor(t, "the assembled snapshot", 5*time.Minute, func() bool { return len(assembledKeys(t, env)) == 1 })
	rep, out := s.run(t, c, "third call", nil, "echo x > /root/x; cat /root/x")
	if rep["path"] != "warm" || rep["root_assembled"] != true || out != "x\n" {
		t.Errorf("third call: path %v root_assembled %v stdout %q; want a resume with the root assembled", rep["path"], rep["root_assembled"], out)
	}
}
