// Package jail tests the VMM's jail end to end: `isopod run` as a normal
// user, whose VMM runs as a subordinate id, and hosts that forbid user
// namespaces, which are refused before anything boots.
package jail

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
