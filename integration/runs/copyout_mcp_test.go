package runs

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

// Through isopod-mcp, a read_files or copy_out naming a guest file that is
// missing, or no regular file, is the caller's mistake, not an internal
// failure to retry.
func TestMCPCopyOutGuestMistakes(t *testing.T) {
	e2e.RequireVM(t)
	root := t.TempDir()
	cmd := exec.Command(filepath.Join(e2e.BinDir, "isopod-mcp"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), knobs.AgentBin+"="+filepath.Join(e2e.BinDir, "isopod-agent"))
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-runs-test", Version: "0"}, nil)
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		t.Fatalf("starting isopod-mcp: %v", err)
	}
	t.Cleanup(func() { cs.Close() })
	for _, tt := range []struct {
		name string
		args map[string]any
		want []string
	}{
		{"read_files missing", map[string]any{"cmd": "true", "read_files": []string{"/root/missing"}},
			[]string{"failed (not_found)", "read_files[0] /root/missing", "no such file or directory"}},
		{"copy_out FIFO", map[string]any{"cmd": "mkfifo /root/fifo", "copy_out": []map[string]string{{"guest": "/root/fifo", "host": "out"}}},
			[]string{"refused", "/root/fifo", "is a FIFO, not a regular file"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.args["base"], tt.args["network"] = "base-min", false
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_run", Arguments: tt.args})
			if err != nil {
				t.Fatal(err)
			}
			var b strings.Builder
			for _, c := range res.Content {
				if tc, ok := c.(*mcp.TextContent); ok {
					b.WriteString(tc.Text)
				}
			}
			text := b.String()
			if !res.IsError || strings.Contains(text, "(internal)") || strings.Contains(text, "retry once") {
				t.Errorf("got %s; want a caller's mistake", text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s\ndoes not say %q", text, w)
				}
			}
			if _, err := os.Lstat(filepath.Join(root, "out")); err == nil {
				t.Error("a failed copy_out left its destination")
			}
		})
	}
}
