//go:build linux

package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
)

// replaceHook sets the walk's test hook for the test's duration.
func replaceHook(t *testing.T, hook func(rel string)) {
	t.Helper()
	old := testHookBeforeOpenDir
	testHookBeforeOpenDir = hook
	t.Cleanup(func() { testHookBeforeOpenDir = old })
}

// swapTree makes a tree whose directory "swap" holds a file, and an
// outside directory holding a secret of the same name.
func swapTree(t *testing.T, git bool) (dir, outside string) {
	t.Helper()
	needTools(t, "git", "mksquashfs", "unsquashfs")
	dir, outside = filepath.Join(t.TempDir(), "tree"), t.TempDir()
	write(t, filepath.Join(dir, "swap/file"), "inside\n", 0o644)
	write(t, filepath.Join(dir, "other"), "other\n", 0o644)
	write(t, filepath.Join(outside, "file"), secretOut+"\n", 0o644)
	if git {
		gitIn(t, dir, "init", "-q")
		gitIn(t, dir, "add", "-A")
	}
	return dir, outside
}

// TestPackSwapDuringWalk replaces a directory with a symlink to outside
// just before the walk opens it: the link is never followed.
func TestPackSwapDuringWalk(t *testing.T) {
	for _, git := range []bool{false, true} {
		t.Run(map[bool]string{false: "outside git", true: "git"}[git], func(t *testing.T) {
			dir, outside := swapTree(t, git)
			var swapped atomic.Bool
			replaceHook(t, func(rel string) {
				if rel == "swap" && !swapped.Swap(true) {
					if err := os.Rename(filepath.Join(dir, "swap"), filepath.Join(dir, "..", "moved")); err != nil {
						t.Error(err)
					}
					if err := os.Symlink(outside, filepath.Join(dir, "swap")); err != nil {
						t.Error(err)
					}
				}
			})
			tr := mustPack(t, dir, Options{})
			if !swapped.Load() {
				t.Fatal("the hook never ran")
			}
			got := unpack(t, tr.Image)
			checkNoSecrets(t, got)
			fi, err := os.Lstat(filepath.Join(got, "swap"))
			switch {
			case git && err == nil:
				// Git named swap/file, not swap: the link is not taken.
				t.Errorf("swap is in the copy as %v; git never named it", fi.Mode())
			case !git && (err != nil || fi.Mode().Type() != os.ModeSymlink):
				t.Errorf("swap: got %v, %v; want the symlink it became", fi, err)
			}
		})
	}
}

// TestPackSwapRace flips a directory and a symlink to outside while trees
// are copied, a bounded number of times: no copy ever holds outside
// content.
func TestPackSwapRace(t *testing.T) {
	if testing.Short() {
		t.Skip("a race loop; -short skips it")
	}
	dir, outside := swapTree(t, false)
	link := filepath.Join(dir, "link.tmp")
	real := filepath.Join(dir, "real.tmp")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		// Swap swap/ and the link back and forth with renames.
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			sw := filepath.Join(dir, "swap")
			if i%2 == 0 {
				_ = os.Rename(sw, real)
				_ = os.Rename(link, sw)
			} else {
				_ = os.Rename(sw, link)
				_ = os.Rename(real, sw)
			}
		}
	})
	defer wg.Wait()
	defer close(stop)
	for range 40 {
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := Pack(t.Context(), f, t.TempDir(), Options{})
		f.Close()
		if err != nil {
			if !errors.Is(err, ErrKeptChanging) {
				t.Fatalf("Pack: %v", err)
			}
			continue
		}
		checkNoSecrets(t, filepath.Join(tr.dir, "tree"))
		tr.Close()
	}
}

// TestSelNames checks names that are not one entry of a directory are
// never acted on, whatever a file list holds.
func TestSelNames(t *testing.T) {
	needTools(t, "mksquashfs")
	parent := t.TempDir()
	dir := filepath.Join(parent, "tree")
	write(t, filepath.Join(dir, "a"), "a\n", 0o644)
	write(t, filepath.Join(parent, "secret"), secretOut, 0o644)
	s := &sel{}
	for _, p := range []string{"a", "../secret", "./a", "x//y"} {
		s.add(p)
	}
	s.kids["a/b"] = &sel{leaf: true}
	src, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	stage := filepath.Join(t.TempDir(), "stage")
	w := &walker{ctx: t.Context(), maxFiles: 100, maxBytes: 1 << 20, skipped: map[string]int{}}
	if err := copyRoot(w, src, stage, s); err != nil {
		t.Fatal(err)
	}
	if got := keys(snapshot(t, stage, false)); len(got) != 1 || got[0] != "a" {
		t.Errorf("copied %q; want only a", got)
	}
}
