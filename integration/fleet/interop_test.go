package fleet

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/mcpserver"
)

// TestTypeScriptClientOverHTTP drives a server with the official
// TypeScript SDK's streamable HTTP client (test/mcp-interop; npm ci there
// first): tools listed, a token required, read_files binary-safe, progress
// received, and a call the client aborts has its VM torn down.
func TestTypeScriptClientOverHTTP(t *testing.T) {
	e2e.RequireVM(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	dir, _ := filepath.Abs("../../test/mcp-interop")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("the TypeScript SDK is not installed: run npm ci in %s", dir)
	}
	s := startServer(t, "A", newHome(t))
	cmd := exec.Command(node, filepath.Join(dir, "http-client.mjs"), s.url, runToken)
	cmd.Dir = dir
	stdin, _ := cmd.StdinPipe()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	c := s.mustConnect(t, adminToken)
	live := func() bool {
		res := c.call(t, context.Background(), mcpserver.ToolVMList, map[string]any{}, nil)
		return strings.Contains(text(res), `"live":true`) && strings.Contains(text(res), "sleep 600")
	}
	if !waitFor(5*time.Minute, func() bool { return len(exited) > 0 || live() }) {
		cmd.Process.Kill()
		t.Fatalf("the aborted call's VM never started\n%s", stderr.String())
	}
	time.Sleep(2 * time.Second)
	stdin.Write([]byte("abort\n"))
	if err := <-exited; err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	var out struct {
		NoToken string `json:"no_token"`
		Tools   []string
		Run     struct {
			IsError    bool
			Structured mcpserver.RunResult
			Progress   []string
		}
		Cancel struct {
			Error  string
			VMGone bool
		}
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v\n%s", err, stdout.String())
	}
	if out.NoToken == "connected" || len(out.Tools) != len(mcpserver.OfferedTools(true, false)) {
		t.Errorf("without a token: %q; tools %v", out.NoToken, out.Tools)
	}
	files := out.Run.Structured.Files
	if out.Run.IsError || len(files) != 1 || files[0].Encoding != "base64" {
		t.Fatalf("run: %+v", out.Run)
	}
	if b, err := base64.StdEncoding.DecodeString(files[0].Content); err != nil || string(b) != "ab\x00cd" {
		t.Errorf("read_files gave %q (%v)", b, err)
	}
	if len(out.Run.Progress) == 0 {
		t.Error("no progress notification reached the TypeScript client")
	}
	if out.Cancel.Error == "completed" || !out.Cancel.VMGone {
		t.Errorf("the aborted call: %+v; want it cancelled and its VM gone", out.Cancel)
	}
	if !waitFor(30*time.Second, func() bool { return len(e2e.VMMsOf(s.home)) == 0 }) {
		t.Errorf("QEMU %v still runs 30 s after the TypeScript client aborted", e2e.VMMsOf(s.home))
	}
}
