package agent

import (
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// TestWalkChanges reads an overlay's upper directory as the kernel leaves
// it: written files, a whiteout, an opaque directory, a symlink, and a
// directory that only holds changes.
func TestWalkChanges(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("whiteouts are character devices: making one needs root")
	}
	lower, upper := t.TempDir(), t.TempDir()
	for _, d := range []string{"sub", "gone", "opaque"} {
		if err := os.Mkdir(filepath.Join(lower, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{"a.txt", "sub/b.txt", "gone/c.txt"} {
		if err := os.WriteFile(filepath.Join(lower, f), []byte("old"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(upper, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(upper, "opaque"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattrs: %v", err)
	}
	for _, w := range []string{"sub/b.txt", "gone"} {
		if err := unix.Mknod(filepath.Join(upper, w), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(upper, "a.txt"), []byte("new!"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("a.txt", filepath.Join(upper, "link")); err != nil {
		t.Fatal(err)
	}
	var got []agentproto.WorkspaceEntry
	err := walkChanges(upper, lower, func(e agentproto.WorkspaceEntry) error {
		got = append(got, e)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []agentproto.WorkspaceEntry{
		{Path: "a.txt", Kind: "file", Mode: 0o755, Size: 4, InOriginal: true},
		{Path: "gone", Kind: "deleted", InOriginal: true},
		{Path: "link", Kind: "symlink", Mode: 0o777, Target: "a.txt"},
		{Path: "opaque", Kind: "opaque", Mode: 0o755, InOriginal: true},
		{Path: "sub/b.txt", Kind: "deleted", InOriginal: true},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("changes:\n got %+v\nwant %+v", got, want)
	}
}
