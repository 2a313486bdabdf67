//go:build linux

package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// TestCopyHoles copies a sparse file as stat saw it: all of it, the part
// stat saw of one that grew since, and what is left of one that shrank.
func TestCopyHoles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte("head"), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte("tail"), 1<<20); err != nil {
		t.Fatal(err)
	}
	whole, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name      string
		size, len int64
	}{
		{"as stat saw it", int64(len(whole)), int64(len(whole))},
		{"grown since", 1 << 19, 1 << 19},
		{"grown since, ending in data", 1<<20 + 2, 1<<20 + 2},
		{"shrunk since", 2 << 20, int64(len(whole))},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, err := os.Create(filepath.Join(t.TempDir(), "out"))
			if err != nil {
				t.Fatal(err)
			}
			defer out.Close()
			n, err := copyHoles(out, f, tt.size)
			if err != nil || n != tt.len {
				t.Fatalf("copyHoles = %d, %v; want %d", n, err, tt.len)
			}
			got, err := os.ReadFile(out.Name())
			if err != nil || !bytes.Equal(got, whole[:tt.len]) {
				t.Errorf("the copy holds %d bytes, not the first %d of the file (%v)", len(got), tt.len, err)
			}
		})
	}
}
