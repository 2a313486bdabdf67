package cli

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/workspace"
)

func TestRaiseHintNamesEachCapsFlag(t *testing.T) {
	files := &workspace.LimitError{What: "entries", Have: 30, AtLeast: true, Limit: 3}
	bytes := &workspace.LimitError{What: "bytes", Have: 25091, Limit: 100}
	err := raiseHint(fmt.Errorf("workspace repo: %w", errors.Join(files, bytes)))
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 2 ||
		!strings.HasSuffix(lines[0], "or raise --workspace-max-files") || !strings.Contains(lines[0], "limit of 3") ||
		!strings.HasSuffix(lines[1], "or raise --workspace-max-bytes") || !strings.Contains(lines[1], "limit of 100") {
		t.Errorf("two caps passed: got\n%v\nwant each line to name its own limit and flag", err)
	}
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("%v: no longer an invalid argument", err)
	}
	one := raiseHint(fmt.Errorf("x: %w", &workspace.LimitError{What: "patch bytes", Have: 9, Limit: 8}))
	if !strings.HasSuffix(one.Error(), "or raise --workspace-max-patch-bytes") {
		t.Errorf("got %v", one)
	}
	plain := errors.New("not a cap")
	if raiseHint(plain) != plain {
		t.Error("an error without a cap changed")
	}
}
