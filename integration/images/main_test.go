// Package images holds the end-to-end tests of what the base images ship:
// they boot real VMs on them and run the programs agents rely on.
package images

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
