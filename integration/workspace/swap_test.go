package workspace

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"isopod/integration/e2e"
)

// A guest that makes tracked symlinks directories, a tracked directory a
// symlink, and links pointing out of the repository gets a patch that git
// apply takes on a pristine copy, giving the guest's tree; the report
// warns of the links out. A sparse file reaches the guest sparse.
func TestWorkspaceLinkDirSwaps(t *testing.T) {
	e2e.RequireDebian(t)
	f := newFixture(t)
	const sparseSize = 64 << 20
	sparse := filepath.Join(f.Dir, "sparse.img")
	write(t, sparse, "head", 0o644)
	if err := os.Truncate(sparse, sparseSize); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, f.Dir)
	patch := filepath.Join(t.TempDir(), "swap.patch")
	script := `
echo "== sparse =="; stat -c '%s %b %B' sparse.img
echo "== changes =="
set -e
rm link-in && mkdir -p link-in/deeper && echo one > link-in/a.txt && echo two > link-in/deeper/b.txt
rm link-out && mkdir link-out && echo mine > link-out/secret.txt
rm -rf rmdir && ln -s sub rmdir
ln -s /etc/passwd abs-link
ln -s ../../escape sub/climb
echo done
echo "== manifest =="
python3 - "$PWD" <<'PY'
` + manifestPy + `
PY
`
	r := run(t, nil, "--base", "base-debian", "--no-network", "--workspace", f.Dir, "--workspace-out", patch,
		"--stdin-file", stdinScript(t, script), "--", "sh", "-c", guestScript)
	s := sections(e2e.Str(r.JSON, "stdout"))
	if s["changes"] != "done\n" {
		t.Fatalf("the guest's changes failed: %q\nstderr: %s", s["changes"], e2e.Str(r.JSON, "stderr"))
	}
	var size, blocks, unit int64
	if fs := strings.Fields(s["sparse"]); len(fs) == 3 {
		size, _ = strconv.ParseInt(fs[0], 10, 64)
		blocks, _ = strconv.ParseInt(fs[1], 10, 64)
		unit, _ = strconv.ParseInt(fs[2], 10, 64)
	}
	if size != sparseSize || blocks*unit > 1<<20 {
		t.Errorf("sparse.img in the guest: %q (size, blocks, block size); want %d bytes taking under 1 MiB", s["sparse"], sparseSize)
	}

	w := wsReport(t, r)
	if w["patch_error"] != nil {
		t.Fatalf("patch_error: %v", w["patch_error"])
	}
	changed, _ := w["changed"].(map[string]any)
	// Added: three files, rmdir, two new links; deleted: link-in,
	// link-out, rmdir's two files.
	if a, _ := num(changed, "added"); a != 6 {
		t.Errorf("changed.added %d; want 6: %v", a, changed)
	}
	if d, _ := num(changed, "deleted"); d != 4 {
		t.Errorf("changed.deleted %d; want 4: %v", d, changed)
	}
	warned := false
	warnings, _ := r.JSON["warnings"].([]any)
	for _, wn := range warnings {
		if s, _ := wn.(string); strings.Contains(s, patch) && strings.Contains(s, `("abs-link", "sub/climb")`) {
			warned = true
		}
	}
	if !warned {
		t.Errorf("no warning names the links out of the repository: %v", r.JSON["warnings"])
	}
	pristine := pristineCopy(t, f, false)
	applyPatch(t, pristine, patch)
	if got := hostManifest(t, pristine); got != s["manifest"] {
		t.Errorf("the patched copy differs from the guest's tree:\nhost:\n%s\nguest:\n%s", got, s["manifest"])
	}
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))
}
