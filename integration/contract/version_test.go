package contract

import (
	"os/exec"
	"path/filepath"
	"testing"

	"isopod/integration/e2e"
	"isopod/internal/version"
)

// TestBinariesReportTheVersion: isopod --version, isopod-mcp --version and
// isopod-mcp's serverInfo say the number in internal/version/VERSION (the
// plugin manifest is held to the same file by internal/version's tests).
func TestBinariesReportTheVersion(t *testing.T) {
	if e2e.BinDir == "" {
		t.Skip("needs the built binaries; skipped under -short")
	}
	want := version.String()
	for _, bin := range []string{"isopod", "isopod-mcp"} {
		out, err := exec.Command(filepath.Join(e2e.BinDir, bin), "--version").Output()
		if err != nil {
			t.Errorf("%s --version: %v", bin, err)
			continue
		}
		if got := string(out); got != bin+" version "+want+"\n" {
			t.Errorf("%s --version printed %q on stdout; want %q", bin, got, bin+" version "+want+"\n")
		}
	}
	cs := e2e.StartMCP(t, "isopod-contract", "", nil)
	if got := cs.InitializeResult().ServerInfo.Version; got != want {
		t.Errorf("isopod-mcp serverInfo.version %q; want %q", got, want)
	}
	if version.Release() == "" || want[:len(version.Release())] != version.Release() {
		t.Errorf("version %q does not start with the release %q", want, version.Release())
	}
}
