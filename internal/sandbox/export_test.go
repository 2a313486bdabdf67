package sandbox

import (
	"testing"
	"time"
)

// SetInlineBuildMin sets the least time a build inside a run gets for
// the rest of the test, which must not run in parallel with others.
func SetInlineBuildMin(t testing.TB, d time.Duration) {
	old := inlineBuildMin
	inlineBuildMin = d
	t.Cleanup(func() { inlineBuildMin = old })
}
