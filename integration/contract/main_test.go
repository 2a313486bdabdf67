// Package contract holds isopod's reports to their contract: the field
// lists in docs/contract/report-fields.json, taken from the MCP
// specification's return shape and class diagram and from the CLI report
// table. Real runs (cold, warm, filtered, a commit, a copy-out) are made
// through the isopod CLI and through isopod-mcp, and every listed field
// must be there under its listed name. The version the binaries report is
// checked here too. The tests boot VMs and are skipped under -short.
package contract

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
