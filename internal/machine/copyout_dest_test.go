package machine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/errdefs"
)

// A node that appears at the destination while a copy is staged is not
// replaced by the rename.
func TestStagedCommitKeepsANewNode(t *testing.T) {
	dest := filepath.Join(t.TempDir(), "out")
	sf, err := newStagedFile(dest, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(dest, 0o600); err != nil {
		t.Fatal(err)
	}
	sf.WriteAt([]byte("new"), 0)
	if err := sf.Commit(3, 0o644); !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "became a FIFO") {
		t.Errorf("Commit over a FIFO: %v; want a refusal", err)
	}
	if st, err := os.Lstat(dest); err != nil || st.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO was replaced: %v, %v", st.Mode(), err)
	}
}
