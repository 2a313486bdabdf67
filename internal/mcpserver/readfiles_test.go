package mcpserver

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/sandbox"
)

// TestReadFilesReword checks that only a copy-out failure of a read_files
// copy is said in read_files' words, by its type, and that its class
// survives: another error that happens to name the private directory is
// left as it is.
func TestReadFilesReword(t *testing.T) {
	var r sandbox.Request
	rf, err := prepareReadFiles(&r, []string{"/out/a", "/out/b"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rf.release)
	cause := fmt.Errorf("the guest file is missing: %w", errdefs.ErrNotFound)
	ours := fmt.Errorf("copying out: %w", &machine.CopyOutError{Guest: "/out/b", Host: rf.host(1), Err: cause})
	got := rf.reword(ours)
	if msg := got.Error(); !strings.Contains(msg, "read_files[1] /out/b") || strings.Contains(msg, rf.tmp) {
		t.Errorf("reworded: %q", msg)
	}
	var coe *machine.CopyOutError
	if !errors.Is(got, errdefs.ErrNotFound) || !errors.As(got, &coe) {
		t.Errorf("the rewording lost the class or the type: %v", got)
	}

	theirs := &machine.CopyOutError{Guest: "/x", Host: "/home/u/x", Err: cause}
	other := fmt.Errorf("cleaning %s: %w", rf.tmp, os.ErrPermission)
	for _, err := range []error{nil, theirs, other} {
		if got := rf.reword(err); got != err {
			t.Errorf("reword(%v) = %v, want it unchanged", err, got)
		}
	}
}
