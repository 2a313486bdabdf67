package oci

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"isopod/integration/e2e"
)

// otherHome is a second private state root, linked to the same installed
// kernel and images as the test binary's own; env makes isopod use it.
func otherHome(t *testing.T) []string {
	t.Helper()
	h, err := e2e.NewHome("", e2e.SourceHome)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	})
	return []string{"ISOPOD_HOME=" + h.Dir}
}

func ok(t *testing.T, env []string, args ...string) map[string]any {
	t.Helper()
	r := e2e.Isopod(t, env, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod %v:\n%s", args, r)
	}
	return r.JSON
}

func layersMoved(res map[string]any) []bool {
	var out []bool
	for _, l := range asSlice(res["layers"]) {
		out = append(out, l.(map[string]any)["moved"] == true)
	}
	return out
}

func baseOf(res map[string]any) map[string]any {
	b, _ := res["base"].(map[string]any)
	return b
}

// TestStagesTravel pushes stages from one state root and pulls them into
// others, through a registry that wants credentials: over an imported
// base that the receiving host has another build of, then over a
// missing base, then over base-min rebuilt differently.
func TestStagesTravel(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	reg.requireAuth("bob", "hunter2")
	creds := "DOCKER_CONFIG=" + dockerConfig(t, reg.Host, "bob", "hunter2")
	a := []string{creds}
	b := append(otherHome(t), creds)

	// The two hosts import different images under the same name.
	reg.push(t, "img/tiny:x", image(t, "amd64", nil, "", layer(t, shellLayer(t, "X")...)))
	reg.push(t, "img/tiny:y", image(t, "amd64", nil, "", layer(t, shellLayer(t, "Y")...)))
	idX := e2e.Str(importOK(t, a, reg.ref("img/tiny:x"), "tiny"), "content_sha256")
	idY := e2e.Str(importOK(t, b, reg.ref("img/tiny:y"), "tiny"), "content_sha256")
	if idX == idY {
		t.Fatal("two different images have one content id")
	}

	one := ok(t, a, "run", "--no-network", "--base", "tiny", "--commit-as", "travel/one", "--", "sh", "-c", "echo one > /root/one")
	push1 := ok(t, a, "stage", "push", "travel/one", reg.ref("stages/travel"))
	if moved := layersMoved(push1); len(moved) != 1 || !moved[0] || baseOf(push1)["moved"] != true {
		t.Fatalf("first push: %v", push1)
	}
	two := ok(t, a, "run", "--no-network", "--stage", "travel/one", "--commit-as", "travel/two", "--", "sh", "-c", "echo two > /root/two")
	before := reg.uploadCounts()
	push2 := ok(t, a, "stage", "push", "travel/two", reg.ref("stages/travel"))
	if moved := layersMoved(push2); len(moved) != 2 || moved[0] || !moved[1] || baseOf(push2)["moved"] != false {
		t.Fatalf("second push: layers moved %v, base %v; want only the new layer sent", moved, baseOf(push2))
	}
	for d, n := range reg.uploadCounts() {
		if n > 1 || (before[d] > 0 && n > before[d]) {
			t.Errorf("blob %s was uploaded %d times", d, n)
		}
	}

	tipID := e2e.Str(two, "stage_id")
	pull := ok(t, b, "stage", "pull", reg.ref("stages/travel:"+tipID))
	if moved := layersMoved(pull); len(moved) != 2 || !moved[0] || !moved[1] || baseOf(pull)["moved"] != true {
		t.Fatalf("pull into the other host: %v", pull)
	}
	infoA, infoB := ok(t, a, "stage", "info", tipID), ok(t, b, "stage", "info", tipID)
	stA, stB := infoA["stage"].(map[string]any), infoB["stage"].(map[string]any)
	if stB["stage_id"] != stA["stage_id"] || stB["label"] != "travel/two" || stB["parent"] != e2e.Str(one, "stage_id") || stB["stale"] != false {
		t.Errorf("pulled stage %v; want %v", stB, stA)
	}
	fork := e2e.Isopod(t, b, "run", "--no-network", "--stage", "travel/two", "--", "sh", "-c", "cat /root/one /root/two /etc/id")
	if e2e.Str(fork.JSON, "stdout") != "one\ntwo\nX\n" || e2e.Str(fork.JSON, "base_sha256") != idX {
		t.Errorf("fork on the other host: %s; want the files and the build the stage was made over (%s)", fork, idX)
	}
	if out := runOut(t, b, "--base", "tiny", "--", "cat", "/etc/id"); out != "Y\n" {
		t.Errorf("the other host's own tiny: %q; want Y", out)
	}
	again := ok(t, b, "stage", "pull", reg.ref("stages/travel:"+tipID))
	if moved := layersMoved(again); moved[0] || moved[1] || baseOf(again)["present"] != true {
		t.Errorf("pulling again moved %v, base %v; want nothing moved", moved, baseOf(again))
	}

	// Without its base, a stage cannot go where no build of it is; where
	// another build is, that is base skew.
	ok(t, a, "stage", "push", "--without-base", "travel/one", reg.ref("stages/nobase:one"))
	c := append(otherHome(t), creds)
	r := e2e.RunFail(t, c, "does not hold", "stage", "pull", reg.ref("stages/nobase:one"))
	if msg := e2e.Str(r.JSON, "error"); !strings.Contains(msg, "tiny") || !strings.Contains(msg, "isopod image import") || !strings.Contains(msg, idX) {
		t.Errorf("missing base refusal: %s", msg)
	}
	importOK(t, c, reg.ref("img/tiny:y"), "tiny")
	e2e.RunFail(t, c, "was made over", "stage", "pull", reg.ref("stages/nobase:one"))

	t.Run("a rebuilt base-min", func(t *testing.T) {
		m := ok(t, a, "run", "--no-network", "--commit-as", "travel/min", "--", "sh", "-c", "echo min > /root/min")
		ok(t, a, "stage", "push", "travel/min", reg.ref("stages/min"))
		e := append(otherHome(t), creds)
		rebuildBaseMin(t, strings.TrimPrefix(e[0], "ISOPOD_HOME="))
		pulled := ok(t, e, "stage", "pull", reg.ref("stages/min:"+e2e.Str(m, "stage_id")))
		if baseOf(pulled)["moved"] != true {
			t.Fatalf("the base did not travel: %v", pulled)
		}
		if out := runOut(t, e, "--stage", "travel/min", "--", "sh", "-c", "cat /root/min; test -e /etc/rebuilt || echo original"); out != "min\noriginal\n" {
			t.Errorf("fork over the travelled base-min: %q", out)
		}
		if out := runOut(t, e, "--", "cat", "/etc/rebuilt"); out != "yes\n" {
			t.Errorf("the host's own base-min: %q", out)
		}
	})
}

// rebuildBaseMin replaces home's base-min with another build of it: the
// same files and one more, a new content id.
func rebuildBaseMin(t *testing.T, home string) {
	t.Helper()
	img := filepath.Join(home, "images", "base-min.sqfs")
	work := t.TempDir()
	root := filepath.Join(work, "root")
	if out, err := exec.Command("unsquashfs", "-d", root, img).CombinedOutput(); err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	os.WriteFile(filepath.Join(root, "etc", "rebuilt"), []byte("yes\n"), 0o644)
	tmp := filepath.Join(home, "images", ".rebuilt.sqfs")
	if out, err := exec.Command("mksquashfs", root, tmp, "-noappend", "-all-root", "-quiet", "-no-progress").CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v\n%s", err, out)
	}
	var side map[string]any
	sp := filepath.Join(home, "images", "base-min.json")
	b, err := os.ReadFile(sp)
	if err != nil || json.Unmarshal(b, &side) != nil {
		t.Fatalf("reading the base-min record: %v", err)
	}
	fi, _ := os.Stat(tmp)
	side["content_sha256"], side["size"] = e2e.FileSHA(t, tmp), fi.Size()
	b, _ = json.Marshal(side)
	// Replace the links by renaming, never write through them.
	os.WriteFile(sp+".new", b, 0o644)
	if err := os.Rename(sp+".new", sp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, img); err != nil {
		t.Fatal(err)
	}
}
