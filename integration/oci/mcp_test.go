package oci

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// startMCP starts the built isopod-mcp and connects the SDK's client.
func startMCP(t *testing.T) *mcp.ClientSession {
	t.Helper()
	return startMCPWith(t)
}

// startMCPWith starts the built isopod-mcp with args.
func startMCPWith(t *testing.T, args ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"), args...)
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), knobs.AgentBin+"="+filepath.Join(e2e.BinDir, "isopod-agent"))
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-oci-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("starting isopod-mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// toolText is a tool result's text content.
func toolText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
