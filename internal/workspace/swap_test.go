//go:build linux

package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// TestPatchLinkDirSwaps replaces tracked symlinks with directories and a
// tracked directory with a symlink, listing the changes as the guest's
// overlay does (a directory made where a link was is opaque), and checks
// git apply on a pristine copy gives the guest's tree.
func TestPatchLinkDirSwaps(t *testing.T) {
	t.Parallel()
	repo, _ := fixture(t)
	pristine := copyTree(t, repo)
	tr := mustPack(t, repo, Options{})

	g := &guest{t: t, tree: copyTree(t, repo), contents: t.TempDir()}
	// A link to a file of the tree, and one to a directory outside it,
	// each become a directory of new files.
	g.remove("link-in")
	g.dir(Added, "link-in")
	g.file(Added, "link-in/a.txt", "was a link\n", 0o644)
	g.dir(Added, "link-in/deeper")
	g.file(Added, "link-in/deeper/b.txt", "below it\n", 0o755)
	// Git judges no path below a link of the host's: this one, which it
	// would ignore elsewhere, is carried.
	g.file(Added, "link-in/x.log", "carried\n", 0o644)
	g.remove("linkdir-out")
	g.dir(Added, "linkdir-out")
	g.file(Added, "linkdir-out/secret.txt", "not the host's\n", 0o644)
	// A directory becomes a link.
	g.link(Modified, "sub/deep", "../src")
	// New links: inside the tree, and out of it three ways.
	g.link(Added, "in", "sub/keep.txt")
	g.link(Added, "sub/up", "../README.md")
	g.link(Added, "abs", "/etc/passwd")
	g.link(Added, "sub/climb", "../../x")
	g.link(Modified, "link-out", "/root")

	var patch bytes.Buffer
	stats, err := tr.Patch(t.Context(), g.changes, &patch)
	if err != nil {
		t.Fatalf("Patch: %v", err)
	}
	// Added: the four new files and five links (sub/deep among them);
	// deleted: two links and sub/deep/more.txt; modified: link-out.
	want := PatchStats{Added: 9, Modified: 1, Deleted: 3, Bytes: int64(patch.Len()),
		LinksOut: []string{"abs", "link-out", "sub/climb"}}
	if !reflect.DeepEqual(stats, want) {
		t.Errorf("stats = %+v; want %+v", stats, want)
	}
	apply(t, pristine, patch.Bytes())
	if d := diffSnapshots(snapshot(t, pristine, true), snapshot(t, g.tree, true)); d != "" {
		t.Errorf("the patched tree differs from the guest's:\n%s\npatch:\n%s", d, patch.String())
	}
}

// TestPatchHostLinkAtPatchTime asks about files added below a directory
// the host has since made a symlink: git cannot judge them, and the patch
// is still made.
func TestPatchHostLinkAtPatchTime(t *testing.T) {
	t.Parallel()
	repo, _ := fixture(t)
	tr := mustPack(t, repo, Options{})
	if err := os.RemoveAll(filepath.Join(repo, "sub/deep")); err != nil {
		t.Fatal(err)
	}
	symlink(t, "../src", filepath.Join(repo, "sub/deep"))
	g := &guest{t: t, tree: copyTree(t, repo), contents: t.TempDir()}
	g.file(Added, "sub/deep/new.txt", "new\n", 0o644)
	var patch bytes.Buffer
	stats, err := tr.Patch(t.Context(), g.changes, &patch)
	if err != nil {
		t.Fatalf("Patch: %v", err)
	}
	if stats.Added != 1 || !strings.Contains(patch.String(), "b/sub/deep/new.txt") {
		t.Errorf("stats %+v; patch:\n%s", stats, patch.String())
	}
}

// TestLinksOut checks which link targets leave the repository, from a
// workspace at its top and from one below it.
func TestLinksOut(t *testing.T) {
	tests := []struct {
		prefix, rel, target string
		out                 bool
	}{
		{"", "a", "b", false},
		{"", "a", "/etc", true},
		{"", "a", "..", true},
		{"", "d/a", "..", false},
		{"", "d/a", "../..", true},
		{"", "d/a", "../../d", true},
		{"", "d/a", "x/../../y", false},
		{"", "a", "./", false},
		{"sub/", "a", "..", false},
		{"sub/", "a", "../..", true},
		{"sub/", "a", "../other/x", false},
	}
	for _, tt := range tests {
		if got := linkLeaves(tt.prefix, tt.rel, tt.target); got != tt.out {
			t.Errorf("linkLeaves(%q, %q, %q) = %v; want %v", tt.prefix, tt.rel, tt.target, got, tt.out)
		}
	}
}
