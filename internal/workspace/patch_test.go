//go:build linux

package workspace

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// guest plays the guest: each change is made in a tree (the expected
// result) and listed as a Change, its content in a file of its own.
type guest struct {
	t        *testing.T
	tree     string // where the changes are made
	contents string // the core's temporary files
	changes  []Change
}

func (g *guest) file(kind ChangeKind, rel, body string, mode os.FileMode) {
	g.t.Helper()
	_ = os.RemoveAll(filepath.Join(g.tree, rel))
	write(g.t, filepath.Join(g.tree, rel), body, mode)
	c := filepath.Join(g.contents, string(rune('a'+len(g.changes))))
	write(g.t, c, body, 0o600)
	g.changes = append(g.changes, Change{Path: rel, Kind: kind, Mode: mode, Content: c})
}

func (g *guest) link(kind ChangeKind, rel, target string) {
	g.t.Helper()
	_ = os.RemoveAll(filepath.Join(g.tree, rel))
	symlink(g.t, target, filepath.Join(g.tree, rel))
	g.changes = append(g.changes, Change{Path: rel, Kind: kind, Mode: fs.ModeSymlink, Target: target})
}

func (g *guest) dir(kind ChangeKind, rel string) {
	g.t.Helper()
	p := filepath.Join(g.tree, rel)
	if fi, err := os.Lstat(p); err != nil || !fi.IsDir() {
		_ = os.RemoveAll(p)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		g.t.Fatal(err)
	}
	g.changes = append(g.changes, Change{Path: rel, Kind: kind, Mode: fs.ModeDir | 0o755})
}

func (g *guest) remove(rel string) {
	g.t.Helper()
	if err := os.RemoveAll(filepath.Join(g.tree, rel)); err != nil {
		g.t.Fatal(err)
	}
	g.changes = append(g.changes, Change{Path: rel, Kind: Deleted})
}

// copyTree copies a tree with cp -a.
func copyTree(t *testing.T, src string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "copy")
	if out, err := exec.Command("cp", "-a", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp: %v\n%s", err, out)
	}
	return dst
}

// apply applies a patch with git apply in dir, checking it first.
func apply(t *testing.T, dir string, patch []byte) {
	t.Helper()
	for _, args := range [][]string{{"apply", "--check"}, {"apply"}} {
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Stdin = dir, bytes.NewReader(patch)
		cmd.Env = gitEnv("GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %s: %v\n%s\npatch:\n%s", strings.Join(args, " "), err, out, patch)
		}
	}
}

// TestPatch makes every kind of change a guest can, and checks git apply
// turns a pristine copy of the host tree into the guest's tree.
func TestPatch(t *testing.T) {
	t.Parallel()
	repo, outside := fixture(t)
	pristine := copyTree(t, repo)
	hostBefore, outsideBefore := snapshot(t, repo, false), snapshot(t, outside, false)
	tr := mustPack(t, repo, Options{})

	g := &guest{t: t, tree: copyTree(t, repo), contents: t.TempDir()}
	g.file(Modified, "README.md", "# fixture\nline two, changed\nline three\n", 0o644)
	g.dir(Added, "new")
	g.dir(Added, "new/dir")
	g.file(Added, "new/dir/file.txt", "in a new directory\n", 0o644)
	g.remove("src/main.go")
	// A patch carries no empty directory: git apply removes src/.
	if err := os.Remove(filepath.Join(g.tree, "src")); err != nil {
		t.Fatal(err)
	}
	g.file(Modified, "sub/keep.txt", "keep\n", 0o755) // chmod +x
	g.file(Modified, "data/blob.bin", binaryBody+"\x00more", 0o644)
	g.file(Added, "data/new.bin", "\x00\x01\x02binary\xff", 0o644)
	g.link(Added, "link-new", "sub/keep.txt")
	g.link(Modified, "link-in", "empty")
	g.remove("linkdir-out")
	g.file(Added, "new-empty", "", 0o644)
	g.file(Modified, "with space/naïve file.txt", "accents, changed\n", 0o644)
	g.file(Added, "with space/ünï cödé.txt", "more accents\n", 0o644)
	g.remove("sub/deep") // removed and made again: an opaque directory
	g.dir(Added, "sub/deep")
	g.file(Added, "sub/deep/new.txt", "new\n", 0o644)
	g.file(Added, "bin", "a directory became a file\n", 0o644)
	g.file(Modified, "untracked.txt", "untracked, changed\n", 0o644)
	g.changes = append(g.changes, Change{Path: ".git/config", Kind: Modified, Content: "/nonexistent"})
	// Files git ignores: one the host holds too (git apply would refuse a
	// patch creating it), and one the host does not.
	ignoredBody := filepath.Join(g.contents, "ignored")
	write(t, ignoredBody, "build output\n", 0o644)
	g.changes = append(g.changes, Change{Path: "debug.log", Kind: Modified, Content: ignoredBody},
		Change{Path: "build/gen.o", Kind: Added, Content: ignoredBody})

	var patch bytes.Buffer
	stats, err := tr.Patch(t.Context(), g.changes, &patch)
	if err != nil {
		t.Fatalf("Patch: %v", err)
	}
	want := PatchStats{Added: 7, Modified: 6, Deleted: 4, LeftOut: 1, Ignored: 2, Bytes: int64(patch.Len())}
	if !reflect.DeepEqual(stats, want) {
		t.Errorf("stats = %+v; want %+v", stats, want)
	}
	if !strings.Contains(patch.String(), "GIT binary patch") {
		t.Error("the patch has no binary hunk")
	}
	for _, unchanged := range []string{"empty\n", "tool.sh\n", "secret", "debug.log", "gen.o"} {
		if strings.Contains(patch.String(), "b/"+unchanged) {
			t.Errorf("the patch names %q, which did not change", unchanged)
		}
	}
	apply(t, pristine, patch.Bytes())
	if d := diffSnapshots(snapshot(t, pristine, true), snapshot(t, g.tree, true)); d != "" {
		t.Errorf("the patched tree differs from the guest's:\n%s", d)
	}
	if d := diffSnapshots(snapshot(t, repo, false), hostBefore); d != "" {
		t.Errorf("the host tree changed:\n%s", d)
	}
	if d := diffSnapshots(snapshot(t, outside, false), outsideBefore); d != "" {
		t.Errorf("the outside directory changed:\n%s", d)
	}
}

// TestPatchPrefix checks patches of a subdirectory of a repository and of a
// tree outside git apply where they should.
func TestPatchPrefix(t *testing.T) {
	t.Parallel()
	repo, _ := fixture(t)
	plain := t.TempDir()
	write(t, filepath.Join(plain, "keep.txt"), "keep\n", 0o644)
	for _, tt := range []struct{ name, dir, prefix string }{
		{"subdirectory", filepath.Join(repo, "sub"), "sub/"},
		{"outside git", plain, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			pristine := copyTree(t, filepath.Dir(tt.dir))
			tr := mustPack(t, tt.dir, Options{})
			g := &guest{t: t, tree: copyTree(t, tt.dir), contents: t.TempDir()}
			g.file(Modified, "keep.txt", "keep, changed\n", 0o644)
			var patch bytes.Buffer
			if _, err := tr.Patch(t.Context(), g.changes, &patch); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(patch.String(), "--- a/"+tt.prefix+"keep.txt") {
				t.Errorf("the patch does not name %skeep.txt:\n%s", tt.prefix, patch.String())
			}
			target := filepath.Join(pristine, filepath.Base(tt.dir))
			apply(t, target, patch.Bytes())
			if b, _ := os.ReadFile(filepath.Join(target, "keep.txt")); string(b) != "keep, changed\n" {
				t.Errorf("keep.txt after git apply: %q", b)
			}
		})
	}
}

// TestPatchRefuses checks hostile and malformed changes are refused before
// anything is written.
func TestPatchRefuses(t *testing.T) {
	t.Parallel()
	repo, outside := fixture(t)
	tr := mustPack(t, repo, Options{})
	content := filepath.Join(t.TempDir(), "content")
	write(t, content, "x\n", 0o644)
	linkContent := filepath.Join(t.TempDir(), "link")
	symlink(t, content, linkContent)
	file := func(p string) Change { return Change{Path: p, Kind: Added, Content: content} }
	tests := []struct {
		name    string
		changes []Change
		want    string
	}{
		{"climbs out", []Change{file("../x")}, "climbs out"},
		{"climbs out later", []Change{file("sub/../../x")}, "not clean"},
		{"absolute", []Change{file("/etc/x")}, "absolute"},
		{"empty", []Change{file("")}, "empty"},
		{"dot", []Change{file(".")}, "empty"},
		{"NUL", []Change{file("a\x00b")}, "NUL"},
		{"trailing slash", []Change{file("a/")}, "not clean"},
		{"through a symlink to outside", []Change{file("linkdir-out/secret.txt")}, "symlink in the workspace"},
		{"deleting through a symlink", []Change{{Path: "linkdir-out/secret.txt", Kind: Deleted}}, "symlink in the workspace"},
		{"through a file", []Change{file("README.md/x")}, "a file in the workspace"},
		{"through a symlink the run made", []Change{{Path: "l", Kind: Added, Mode: fs.ModeSymlink, Target: outside}, file("l/x")}, "made a symlink"},
		{"content through a symlink", []Change{{Path: "x", Kind: Added, Content: linkContent}}, "not a regular file"},
		{"content a device", []Change{{Path: "x", Kind: Added, Content: "/dev/zero"}}, "not a regular file"},
		{"content relative", []Change{{Path: "x", Kind: Added, Content: "content"}}, "absolute content path"},
		{"a socket", []Change{{Path: "x", Kind: Added, Mode: fs.ModeSocket}}, "only regular files"},
		{"a link without a target", []Change{{Path: "x", Kind: Added, Mode: fs.ModeSymlink}}, "without a target"},
		{"listed twice", []Change{file("x"), file("x")}, "twice"},
		{"unknown kind", []Change{{Path: "x", Kind: 9}}, "unknown kind"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w bytes.Buffer
			_, err := tr.Patch(t.Context(), tt.changes, &w)
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(fmtErr(err), tt.want) {
				t.Errorf("got %v; want an invalid argument saying %q", err, tt.want)
			}
			if w.Len() != 0 {
				t.Errorf("a refused patch wrote %d bytes", w.Len())
			}
		})
	}
	if _, err := os.Stat(filepath.Join(outside, "x")); err == nil {
		t.Error("something was written outside")
	}
}

func fmtErr(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// TestPatchCaps checks the patch cap covers both the new content and the
// patch itself.
func TestPatchCaps(t *testing.T) {
	t.Parallel()
	needTools(t, "git", "mksquashfs")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "big.txt"), strings.Repeat("a line of text\n", 200), 0o644)
	tr := mustPack(t, dir, Options{MaxPatchBytes: 1000})
	content := filepath.Join(t.TempDir(), "c")
	write(t, content, strings.Repeat("y", 2000), 0o644)
	tests := []struct {
		name    string
		changes []Change
		want    string
	}{
		{"new content", []Change{{Path: "new", Kind: Added, Content: content}}, "changed files holding 2000 bytes"},
		{"deletion", []Change{{Path: "big.txt", Kind: Deleted}}, "the patch is more than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var w bytes.Buffer
			_, err := tr.Patch(t.Context(), tt.changes, &w)
			var le *LimitError
			if !errors.As(err, &le) || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "limit of 1000") {
				t.Errorf("got %v; want a LimitError saying %q and the limit", err, tt.want)
			}
			if w.Len() != 0 {
				t.Errorf("a refused patch wrote %d bytes", w.Len())
			}
		})
	}
}

// TestPatchSHA256 checks a patch for a repository of SHA-256 objects
// carries ids git apply checks binary hunks against.
func TestPatchSHA256(t *testing.T) {
	t.Parallel()
	needTools(t, "git", "mksquashfs")
	repo := filepath.Join(t.TempDir(), "repo")
	gitIn(t, filepath.Dir(repo), "init", "-q", "--object-format=sha256", repo)
	write(t, filepath.Join(repo, "blob.bin"), binaryBody, 0o644)
	gitIn(t, repo, "add", "-A")
	gitIn(t, repo, "commit", "-q", "-m", "sha256")
	pristine := copyTree(t, repo)
	tr := mustPack(t, repo, Options{})
	g := &guest{t: t, tree: copyTree(t, repo), contents: t.TempDir()}
	g.file(Modified, "blob.bin", binaryBody+"\x00changed", 0o644)
	var patch bytes.Buffer
	if _, err := tr.Patch(t.Context(), g.changes, &patch); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(patch.String(), "GIT binary patch") {
		t.Fatalf("no binary hunk:\n%s", patch.String())
	}
	if idx := strings.SplitN(strings.SplitN(patch.String(), "index ", 2)[1], "..", 2)[0]; len(idx) != 64 {
		t.Errorf("the preimage id %q is not a SHA-256 id", idx)
	}
	apply(t, pristine, patch.Bytes())
	if d := diffSnapshots(snapshot(t, pristine, true), snapshot(t, g.tree, true)); d != "" {
		t.Errorf("the patched tree differs from the guest's:\n%s", d)
	}
}
