package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/knobs"
)

// StartMCP starts this tree's isopod-mcp on stdio with args, in dir (""
// a new temporary directory), over the private state root with env added,
// and connects the SDK's client to it as name. Its stderr is logged when
// the test fails; the session is closed when it ends.
func StartMCP(t *testing.T, name, dir string, args []string, env ...string) *mcp.ClientSession {
	t.Helper()
	cs, _ := StartMCPProcess(t, name, dir, args, env...)
	return cs
}

// StartMCPProcess is StartMCP that also returns the server's process, for
// a test that kills it.
func StartMCPProcess(t *testing.T, name, dir string, args []string, env ...string) (*mcp.ClientSession, *os.Process) {
	t.Helper()
	if dir == "" {
		dir = t.TempDir()
	}
	cmd := exec.Command(filepath.Join(BinDir, "isopod-mcp"), args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), knobs.AgentBin+"="+filepath.Join(BinDir, "isopod-agent")), env...)
	logs := new(LockedBuffer)
	cmd.Stderr = logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("isopod-mcp stderr:\n%s", logs)
		}
	})
	client := mcp.NewClient(&mcp.Implementation{Name: name, Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("starting isopod-mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs, cmd.Process
}

// ToolText is a tool result's text content.
func ToolText(r *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range r.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
