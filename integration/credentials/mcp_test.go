package credentials

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

// TestInjectMCPUniformRefusal: over MCP, a store others can read, an
// alias whose source is not set, an unknown alias and an alias not
// marked for MCP all get the same refusal, which names neither the store
// nor the alias, before any VM starts.
func TestInjectMCPUniformRefusal(t *testing.T) {
	e2e.RequireVM(t)
	cs := startMCP(t, tokenEnv+"="+secret)
	mcpAlias := strings.Replace(upAlias, `"allow"`, `"mcp": true, "allow"`, 1)
	unset := strings.Replace(mcpAlias, tokenEnv, "CRED_E2E_UNSET", 1)
	var first string
	for _, tt := range []struct {
		name    string
		perm    uint32
		aliases map[string]string
		inject  string
	}{
		{"store readable by others", 0o644, map[string]string{"e2eupstream": mcpAlias}, "e2eupstream"},
		{"source not set", 0o600, map[string]string{"e2eupstream": unset}, "e2eupstream"},
		{"unknown alias", 0o600, map[string]string{"e2eupstream": mcpAlias}, "e2eunknown"},
		{"alias not for MCP", 0o600, map[string]string{"e2eupstream": upAlias}, "e2eupstream"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			writeStore(t, nil, fsMode(tt.perm), tt.aliases)
			before := vmCount(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_run",
				Arguments: map[string]any{"cmd": "true", "inject": []string{tt.inject}}})
			if err != nil {
				t.Fatal(err)
			}
			text := toolText(res)
			if !res.IsError || !strings.HasPrefix(text, "sandbox_run refused: ") {
				t.Fatalf("result %q; want a refusal", text)
			}
			for _, leak := range []string{"credentials.json", e2e.HomeDir, tt.inject, tokenEnv, "0644", secret} {
				if strings.Contains(text, leak) {
					t.Errorf("the refusal %q says %q", text, leak)
				}
			}
			if first == "" {
				first = text
			} else if text != first {
				t.Errorf("refusal %q differs from %q", text, first)
			}
			if after := vmCount(t); after != before {
				t.Errorf("%d VM records before, %d after: a VM started", before, after)
			}
		})
	}
}

// startMCP starts isopod-mcp on stdio over the private state root.
func startMCP(t *testing.T, env ...string) *mcp.ClientSession {
	t.Helper()
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"))
	cmd.Dir = t.TempDir()
	cmd.Env = append(append(os.Environ(), knobs.AgentBin+"="+filepath.Join(e2e.BinDir, "isopod-agent")), env...)
	logs := new(e2e.LockedBuffer)
	cmd.Stderr = logs
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("isopod-mcp stderr:\n%s", logs)
		}
	})
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-credentials-e2e", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("starting isopod-mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// toolText is a tool result's text.
func toolText(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}
