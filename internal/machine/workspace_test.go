package machine

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/workspace"
)

// TestChangesOf: each kind of entry the guest lists means its changes; an
// unknown kind is refused, naming it.
func TestChangesOf(t *testing.T) {
	tests := []struct {
		e    agentproto.WorkspaceEntry
		want []workspace.Change
	}{
		{agentproto.WorkspaceEntry{Path: "gone", Kind: "deleted"}, []workspace.Change{{Path: "gone", Kind: workspace.Deleted}}},
		{agentproto.WorkspaceEntry{Path: "d", Kind: "opaque", Mode: 0o40755},
			[]workspace.Change{{Path: "d", Kind: workspace.Deleted}, {Path: "d", Kind: workspace.Added, Mode: fs.ModeDir | 0o755}}},
		{agentproto.WorkspaceEntry{Path: "d", Kind: "dir", Mode: 0o700, InOriginal: true},
			[]workspace.Change{{Path: "d", Kind: workspace.Modified, Mode: fs.ModeDir | 0o700}}},
		{agentproto.WorkspaceEntry{Path: "l", Kind: "symlink", Target: "../x"},
			[]workspace.Change{{Path: "l", Kind: workspace.Added, Mode: fs.ModeSymlink | 0o777, Target: "../x"}}},
		{agentproto.WorkspaceEntry{Path: "f", Kind: "file", Mode: 0o4755, InOriginal: true},
			[]workspace.Change{{Path: "f", Kind: workspace.Modified, Mode: 0o755}}},
	}
	for _, tt := range tests {
		got, err := changesOf(tt.e)
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("changesOf(%+v) = %+v, %v; want %+v", tt.e, got, err, tt.want)
		}
	}
	if _, err := changesOf(agentproto.WorkspaceEntry{Path: "p", Kind: "fifo"}); err == nil || !strings.Contains(err.Error(), `"fifo"`) {
		t.Errorf("unknown kind: %v; want a refusal naming it", err)
	}
}

// TestAppendWriter: writes land one after another through WriteAt.
func TestAppendWriter(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w := &appendWriter{w: f}
	io.WriteString(w, "one ")
	io.WriteString(w, "two")
	if b, _ := os.ReadFile(f.Name()); string(b) != "one two" || w.off != 7 {
		t.Errorf("wrote %q, offset %d", b, w.off)
	}
}
