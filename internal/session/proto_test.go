package session

import (
	"errors"
	"fmt"
	"testing"

	"isopod/internal/errdefs"
)

// TestAnswerErr: a supervisor's failure comes back in its class, its
// message said once.
func TestAnswerErr(t *testing.T) {
	sent := fmt.Errorf("no %q call: %w", "pause", errdefs.ErrNotSupported)
	a := Answer{Error: sent.Error(), Class: errdefs.Class(sent)}
	err := a.Err()
	if !errors.Is(err, errdefs.ErrNotSupported) || err.Error() != sent.Error() {
		t.Errorf("Err() = %q (class %s); want %q", err, errdefs.Class(err), sent)
	}
	if err := (&Answer{OK: true}).Err(); err != nil {
		t.Errorf("a success: %v", err)
	}
}
