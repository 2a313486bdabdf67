package workspace

import (
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"isopod/integration/e2e"
)

func TestMain(m *testing.M) { os.Exit(e2e.Main(m)) }

var agentOnce struct {
	sync.Once
	err string
}

// requireFreshAgent makes the guests boot the agent built from this tree:
// the workspace lives in the agent as much as in the host. When the
// installed initramfs holds another agent it is rebuilt in the private
// state root (a rename over the link there, the installed one untouched).
func requireFreshAgent(t *testing.T) {
	t.Helper()
	agentOnce.Do(func() {
		var side struct {
			AgentSHA256 string `json:"agent_sha256"`
		}
		b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "images", "initramfs.json"))
		if err == nil {
			err = json.Unmarshal(b, &side)
		}
		if err == nil && side.AgentSHA256 == e2e.FileSHA(t, filepath.Join(e2e.BinDir, "isopod-agent")) {
			return
		}
		if r := e2e.Isopod(t, nil, "image", "build", "initramfs"); r.Code != 0 {
			agentOnce.err = r.String()
		}
	})
	if agentOnce.err != "" {
		t.Fatalf("rebuilding the initramfs with this tree's agent:\n%s", agentOnce.err)
	}
}
