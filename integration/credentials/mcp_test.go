package credentials

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
)

// TestInjectMCPUniformRefusal: over MCP, a store others can read, an
// alias whose source is not set, an unknown alias and an alias not
// marked for MCP all get the same refusal, which names neither the store
// nor the alias, before any VM starts.
func TestInjectMCPUniformRefusal(t *testing.T) {
	e2e.RequireVM(t)
	cs := e2e.StartMCP(t, "isopod-credentials-e2e", "", nil, tokenEnv+"="+secret)
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
			text := e2e.ToolText(res)
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
