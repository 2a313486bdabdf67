package mcpserver

import (
	"bytes"
	"isopod/internal/hostio/hostiotest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginLauncher runs .claude-plugin/isopod-mcp against stand-in
// servers (shell scripts that print which one ran) in a controlled PATH.
func TestPluginLauncher(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	repo := filepath.Dir(filepath.Dir(interopDir(t)))
	launcher := filepath.Join(repo, ".claude-plugin", "isopod-mcp")
	if fi, err := os.Stat(launcher); err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("launcher %s missing or not executable: %v", launcher, err)
	}
	fake := func(dir, name string) string {
		t.Helper()
		hostiotest.MustMkdir(t, dir)
		p := filepath.Join(dir, "isopod-mcp")
		if err := os.WriteFile(p, []byte("#!/bin/sh\necho "+name+" \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tmp := t.TempDir()
	plugin := filepath.Join(tmp, "plugin")
	envBin := fake(filepath.Join(tmp, "envbin"), "env")
	pathDir := filepath.Join(tmp, "pathdir")
	fake(pathDir, "path")
	home := filepath.Join(tmp, "home")
	hostiotest.MustMkdir(t, home)
	basePath := "/usr/sbin:/sbin:/bin"

	tests := []struct {
		name     string
		setup    func()
		env      []string
		want     string // stdout; "" means: not found
		wantCode int
	}{
		{"nothing installed", nil, []string{"PATH=" + basePath}, "", 127},
		{"usual location", func() { fake(filepath.Join(home, ".local", "bin"), "local") }, []string{"PATH=" + basePath}, "local --x", 0},
		{"PATH before usual locations", nil, []string{"PATH=" + pathDir + ":" + basePath}, "path --x", 0},
		{"ISOPOD_MCP_BIN before PATH", nil, []string{"PATH=" + pathDir + ":" + basePath, "ISOPOD_MCP_BIN=" + envBin}, "env --x", 0},
		{"the launcher itself on PATH is skipped", nil, []string{"PATH=" + filepath.Dir(launcher) + ":" + pathDir + ":" + basePath}, "path --x", 0},
		{"a build in the plugin root first", func() { fake(filepath.Join(plugin, "bin"), "plugin") },
			[]string{"PATH=" + pathDir + ":" + basePath, "ISOPOD_MCP_BIN=" + envBin}, "plugin --x", 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wantCode != 0 {
				for _, p := range []string{"/usr/local/bin/isopod-mcp", "/usr/bin/isopod-mcp"} {
					if _, err := os.Stat(p); err == nil {
						t.Skipf("%s is installed on this host", p)
					}
				}
			}
			if tc.setup != nil {
				tc.setup()
			}
			cmd := exec.Command(sh, launcher, "--x")
			cmd.Env = append([]string{"HOME=" + home, "CLAUDE_PLUGIN_ROOT=" + plugin}, tc.env...)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d (stderr %q)", code, tc.wantCode, stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != tc.want {
				t.Errorf("stdout %q, want %q", got, tc.want)
			}
			if tc.want == "" && !strings.Contains(stderr.String(), "scripts/install.sh") {
				t.Errorf("no install instructions on stderr: %q", stderr.String())
			}
		})
	}
}
