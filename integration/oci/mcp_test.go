package oci

import (
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
)

// startMCP starts the built isopod-mcp and connects the SDK's client.
func startMCP(t *testing.T) *mcp.ClientSession { return startMCPWith(t) }

// startMCPWith starts the built isopod-mcp with args.
func startMCPWith(t *testing.T, args ...string) *mcp.ClientSession {
	t.Helper()
	return e2e.StartMCP(t, "isopod-oci-test", "", args)
}
