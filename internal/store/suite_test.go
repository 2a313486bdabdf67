package store_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/store"
	"isopod/internal/store/storetest"
)

// TestConformance runs the store's conformance suite on the real store.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Target{
		New: func(t *testing.T) store.Interface {
			root := t.TempDir()
			s, err := store.Open(filepath.Join(root, "stages"), store.Options{LocksDir: filepath.Join(root, "locks"), Version: "test-1"})
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			return s
		},
		Interrupt: func(t *testing.T, s store.Interface) string {
			// What a process killed between the copy and the publishing
			// rename leaves: a temporary directory with a partial layer
			// and an unheld commit lock.
			name := ".tmp-st-00000000000000aa-12345"
			dir := filepath.Join(s.(*store.Store).Dir(), name)
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{"layer.ext4", ".lock"} {
				if err := os.WriteFile(filepath.Join(dir, f), []byte("partial"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			age(t, dir)
			return name
		},
		Age: func(t *testing.T, _ store.Interface, dir string) { age(t, dir) },
	})
}

// age makes dir older than GC's wait.
func age(t *testing.T, dir string) {
	t.Helper()
	old := time.Now().Add(-time.Hour)
	if err := os.Chtimes(dir, old, old); err != nil {
		t.Fatal(err)
	}
}
