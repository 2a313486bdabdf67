package machine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"isopod/internal/hostio"
)

func TestStagedFile(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "out")
	os.WriteFile(dest, []byte("old"), 0o644)
	sf, err := newStagedFile(dest, nil)
	if err != nil {
		t.Fatal(err)
	}
	sf.WriteAt([]byte("new"), 0)
	sf.Abort()
	if b, _ := os.ReadFile(dest); string(b) != "old" {
		t.Errorf("abort changed the destination: %q", b)
	}
	sf, _ = newStagedFile(dest, nil)
	sf.WriteAt([]byte("new"), 0)
	if err := sf.Commit(3, 0o4777); err != nil {
		t.Fatal(err)
	}
	st, _ := os.Stat(dest)
	if b, _ := os.ReadFile(dest); string(b) != "new" || st.Mode().Perm() != 0o755 || st.Mode()&os.ModeSetuid != 0 {
		t.Errorf("commit: %q mode %v", b, st.Mode())
	}
	os.Symlink(dest, filepath.Join(dir, "link"))
	if _, err := newStagedFile(filepath.Join(dir, "link"), nil); !errors.Is(err, hostio.ErrSymlink) {
		t.Errorf("symlink destination: %v", err)
	}
	if _, err := newStagedFile(filepath.Join(dir, "missing", "f"), nil); err == nil {
		t.Errorf("missing parent accepted")
	}
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".part") {
			t.Errorf("staging file left: %s", e.Name())
		}
	}
	long := strings.Repeat("é", 200)
	if n := stagingName(long); len(n) > maxNameBytes || !utf8.ValidString(n) {
		t.Errorf("staging name %d bytes, valid %v", len(n), utf8.ValidString(n))
	}
}

// TestStagedFileSparse: what the guest left out stays a hole, the size is
// the guest file's, and a directory given by descriptor is written even
// after its path was swapped for a symlink.
func TestStagedFileSparse(t *testing.T) {
	dir := t.TempDir()
	dest := filepath.Join(dir, "sparse")
	sf, err := newStagedFile(dest, nil)
	if err != nil {
		t.Fatal(err)
	}
	sf.WriteAt([]byte("end"), 1<<30-3)
	if err := sf.Commit(1<<30, 0o644); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(dest)
	if err != nil {
		t.Fatal(err)
	}
	blocks := st.Sys().(*syscall.Stat_t).Blocks * 512
	if st.Size() != 1<<30 || blocks > 1<<20 {
		t.Errorf("size %d, %d bytes allocated; want 1 GiB with almost nothing allocated", st.Size(), blocks)
	}

	real := filepath.Join(dir, "real")
	os.Mkdir(real, 0o755)
	d, err := os.Open(real)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	moved := filepath.Join(dir, "moved")
	os.Rename(real, moved)
	os.Symlink(t.TempDir(), real) // the path now leads elsewhere
	sf, err = newStagedFile(filepath.Join(real, "f"), d)
	if err != nil {
		t.Fatal(err)
	}
	sf.WriteAt([]byte("x"), 0)
	if err := sf.Commit(1, 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(moved, "f")); err != nil || string(b) != "x" {
		t.Errorf("the file did not land in the directory given by descriptor: %q %v", b, err)
	}
}
