package agent

import (
	"os"
	"path/filepath"
	"testing"
)

// TestPrefetchTree: the layers' trees are walked through the root, an
// entry two layers share counted once, and the walk stops at its budget.
func TestPrefetchTree(t *testing.T) {
	top, bottom := t.TempDir(), t.TempDir()
	mk := func(root string, paths ...string) {
		t.Helper()
		for _, p := range paths {
			full := filepath.Join(root, p)
			if filepath.Ext(p) == "" {
				if err := os.MkdirAll(full, 0o755); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(full, []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Entries: opt, opt/app, opt/app/a.txt, opt/app/b.txt, opt/app/deep,
	// opt/app/deep/c.txt, etc, etc/x.conf: 8, with opt and opt/app in both.
	mk(top, "opt/app/a.txt", "opt/app/deep/c.txt")
	mk(bottom, "opt/app/b.txt", "etc/x.conf")
	// The root is the merged tree, as the overlay shows it.
	root := t.TempDir()
	mk(root, "opt/app/a.txt", "opt/app/b.txt", "opt/app/deep/c.txt", "etc/x.conf")

	for _, tc := range []struct {
		max, want int
	}{
		{0, 0},
		{1, 1},
		{3, 3},
		{100, 8},
	} {
		if got := prefetchTree([]string{top, bottom}, root, tc.max); got != tc.want {
			t.Errorf("prefetchTree(max %d) = %d; want %d", tc.max, got, tc.want)
		}
	}
	// A layer that is gone, or a root missing a layer's entry, is skipped.
	// opt is looked up, and not descended into: the root has no opt.
	if got := prefetchTree([]string{filepath.Join(top, "gone"), top}, t.TempDir(), 100); got != 1 {
		t.Errorf("prefetchTree with a layer gone, over an empty root = %d; want 1", got)
	}
}
