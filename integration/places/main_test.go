// Package places tests the host-wide VM places end to end: CLI runs,
// sessions and an MCP server under one state root count their VMs in its
// ledger against one limit.
package places

import (
	"os"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }
