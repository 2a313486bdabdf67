package credentials

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
)

// httpToken is the MCP listener's bearer token in these tests.
const httpToken = "cred-e2e-mcp-token-0123456789"

// TestInjectMCPHTTP: over MCP's streamable HTTP transport, sandbox_run
// with inject reaches the upstream through the endpoint for an alias
// marked "mcp": true, with the secret nowhere in the result; an alias
// not marked for MCP gets the same refusal as an unknown one, before any
// VM starts.
func TestInjectMCPHTTP(t *testing.T) {
	e2e.RequireVM(t)
	up := startUpstream(t)
	mcpAlias := strings.Replace(upAlias, `"allow"`, `"mcp": true, "allow"`, 1)
	writeStore(t, up, 0o600, map[string]string{"formodel": mcpAlias, "operatoronly": upAlias})
	cs := startMCPHTTP(t, tokenEnv+"="+secret)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_run", Arguments: map[string]any{
		"cmd": `echo "got=$(wget -q -O- $ISOPOD_CREDENTIAL_ENDPOINT/formodel/ok/mcp)"`, "inject": []string{"formodel"}, "base": "base-min", "timeout_s": 600}})
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := json.Marshal(res.StructuredContent)
	var rep struct {
		ExitCode *int   `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Egress   struct {
			Injected []string `json:"injected"`
		} `json:"egress"`
	}
	if err := json.Unmarshal(raw, &rep); err != nil || res.IsError || rep.ExitCode == nil || *rep.ExitCode != 0 {
		t.Fatalf("sandbox_run inject formodel: error %v, result %s %s", err, raw, e2e.ToolText(res))
	}
	if !strings.Contains(rep.Stdout, "got=upstream:/ok/mcp\n") || len(rep.Egress.Injected) != 1 || rep.Egress.Injected[0] != "formodel" {
		t.Errorf("stdout %q, injected %v", rep.Stdout, rep.Egress.Injected)
	}
	if strings.Contains(string(raw)+e2e.ToolText(res), secret) {
		t.Error("the secret is in the tool's result")
	}

	var refusals []string
	for _, alias := range []string{"operatoronly", "nosuchalias"} {
		before := vmCount(t)
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "sandbox_run", Arguments: map[string]any{"cmd": "true", "inject": []string{alias}}})
		if err != nil {
			t.Fatal(err)
		}
		text := e2e.ToolText(res)
		if !res.IsError || !strings.HasPrefix(text, "sandbox_run refused: ") || strings.Contains(text, alias) || strings.Contains(text, "credentials.json") {
			t.Errorf("inject %s: result %q; want the uniform refusal", alias, text)
		}
		if after := vmCount(t); after != before {
			t.Errorf("inject %s: %d VM records before, %d after: a VM started", alias, before, after)
		}
		refusals = append(refusals, text)
	}
	if refusals[0] != refusals[1] {
		t.Errorf("an alias not for MCP is refused with %q, an unknown one with %q", refusals[0], refusals[1])
	}
}

// startMCPHTTP starts isopod-mcp --listen on loopback over the private
// state root with env added, and connects to it with the run token.
func startMCPHTTP(t *testing.T, env ...string) *mcp.ClientSession {
	t.Helper()
	url := e2e.StartMCPHTTP(t, "run "+httpToken+"\n", env...)
	return e2e.ConnectHTTP(t, "isopod-credentials-e2e", url, httpToken)
}
