// Package credentials holds the end-to-end tests of credential injection:
// a run with --inject (and sandbox_run's inject) reaches an HTTPS server
// on the host's loopback through the VM's credential endpoint (git's
// clone and push among them), with a secret that is found nowhere in the
// guest, the state root or the report; its host is pinned; bad stores and aliases are refused before
// any VM starts.
package credentials

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
