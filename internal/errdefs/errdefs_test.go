package errdefs

import (
	"errors"
	"fmt"
	"testing"
)

// FromClass undoes Class for every class, and gives nothing for an
// internal failure or a name it does not know.
func TestFromClass(t *testing.T) {
	for _, e := range []error{ErrInvalidArgument, ErrNotFound, ErrAlreadyExists, ErrFailedPrecondition, ErrUnavailable, ErrNotSupported} {
		name := Class(fmt.Errorf("wrapped: %w", e))
		if got := FromClass(name); !errors.Is(got, e) {
			t.Errorf("FromClass(%q) = %v; want %v", name, got, e)
		}
	}
	for _, name := range []string{"internal", "", "bogus"} {
		if got := FromClass(name); got != nil {
			t.Errorf("FromClass(%q) = %v; want nil", name, got)
		}
	}
}
