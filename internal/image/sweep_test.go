package image

import (
	"isopod/internal/paths"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestSweepTemp(t *testing.T) {
	paths := paths.Paths{Home: t.TempDir()}
	old := time.Now().Add(-TempMaxAge - time.Hour)
	mk := func(dir, name string, age time.Time, isDir bool) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if isDir {
			if err := os.MkdirAll(filepath.Join(p, "root", "etc"), 0o755); err != nil {
				t.Fatal(err)
			}
		} else if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(p, age, age); err != nil {
			t.Fatal(err)
		}
		return p
	}
	gone := []string{
		mk(paths.Images(), ".tmp-base-debian-123", old, true),
		mk(paths.Images(), ".tmp-base-min.sqfs-456", old, false),
		mk(paths.Kernels(), ".download-789", old, true),
		mk(paths.Kernels(), ".tmp-6.1.176-1-abc", old, true),
	}
	kept := []string{
		mk(paths.Images(), ".tmp-base-debian-999", time.Now(), true), // a build at work
		mk(paths.Images(), "base-min.sqfs", old, false),
		mk(paths.Kernels(), "6.1.176-1", old, true),
	}
	removed := SweepTemp(paths, TempMaxAge, nil)
	slices.Sort(removed)
	slices.Sort(gone)
	if !slices.Equal(removed, gone) {
		t.Errorf("removed %q; want %q", removed, gone)
	}
	for _, p := range gone {
		if _, err := os.Lstat(p); !os.IsNotExist(err) {
			t.Errorf("%s still there (%v)", p, err)
		}
	}
	for _, p := range kept {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s was removed: %v", p, err)
		}
	}
	// A missing state root is not an error.
	if got := SweepTemp(emptyRoot(t), TempMaxAge, nil); len(got) != 0 {
		t.Errorf("sweep of an empty root removed %q", got)
	}
}

func emptyRoot(t *testing.T) paths.Paths {
	t.Helper()
	return paths.Paths{Home: filepath.Join(t.TempDir(), "none")}
}
