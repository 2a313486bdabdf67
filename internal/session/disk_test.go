package session

import (
	"os"
	"path/filepath"
	"testing"

	"isopod/internal/paths"
)

// A session's disk is what its files take, a sparse file's holes free.
func TestDiskBytes(t *testing.T) {
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := Store{Paths: p}
	dir := st.SessionDir("ss-000000000001")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if n := st.DiskBytes("ss-000000000001"); n > 64<<10 {
		t.Errorf("an empty session takes %d bytes", n)
	}
	f, err := os.Create(filepath.Join(dir, "disk.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(1 << 30); err != nil { // a 1 GiB hole
		t.Fatal(err)
	}
	if _, err := f.WriteAt(make([]byte, 1<<20), 0); err != nil {
		t.Fatal(err)
	}
	f.Sync()
	if n := st.DiskBytes("ss-000000000001"); n < 1<<20 || n > 4<<20 {
		t.Errorf("a 1 GiB sparse file holding 1 MiB takes %d bytes; want about 1 MiB", n)
	}
}
