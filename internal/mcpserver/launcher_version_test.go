package mcpserver

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestPluginLauncherVersions runs .claude-plugin/isopod-mcp with a plugin
// root that declares a version, against stand-in servers that report
// versions of their own: only a server of the plugin's major.minor runs.
func TestPluginLauncherVersions(t *testing.T) {
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skip("no sh")
	}
	repo, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	launcher := filepath.Join(repo, ".claude-plugin", "isopod-mcp")
	installed := false
	for _, p := range []string{"/usr/local/bin/isopod-mcp", "/usr/bin/isopod-mcp"} {
		if _, err := os.Stat(p); err == nil {
			installed = true
		}
	}
	const basePath = "/usr/sbin:/sbin:/bin"

	// server writes a stand-in isopod-mcp into dir that reports version
	// (nothing when "") and, run otherwise, prints name and its arguments.
	server := func(t *testing.T, dir, name, version string) string {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(dir, "isopod-mcp")
		answer := ""
		if version != "" {
			answer = "echo 'isopod-mcp version " + version + "'"
		}
		script := "#!/bin/sh\nif [ \"$1\" = --version ]; then " + answer + "\nexit 0; fi\necho " + name + " \"$@\"\n"
		if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// plugin makes a plugin root (under the given parts of tmp) that
	// declares version.
	plugin := func(t *testing.T, root, version string) {
		t.Helper()
		dir := filepath.Join(root, ".claude-plugin")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		json := "{\n  \"name\": \"isopod\",\n  \"version\": \"" + version + "\",\n  \"skills\": [\"./skill\"]\n}\n"
		if err := os.WriteFile(filepath.Join(dir, "plugin.json"), []byte(json), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	type want struct {
		stdout string // "" with a non-zero code: nothing ran
		code   int
		stderr []string // each must appear
	}
	tests := []struct {
		name   string
		plugin string // plugin version
		// setup lays out servers under tmp and returns the plugin root
		// and the PATH to use.
		setup func(t *testing.T, tmp string) (root, path string)
		want  want
	}{
		{"same version", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "0.1.0")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{stdout: "path --x"}},
		{"a build suffix and another patch level are no difference", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "0.1.7+g1a2b3c4d.dirty")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{stdout: "path --x"}},
		{"another minor version is refused", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "0.2.0")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{code: 126, stderr: []string{"isopod-mcp 0.2.0", "the plugin is 0.1.0", "refused"}}},
		{"another major version is refused", "1.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "0.1.0")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{code: 126, stderr: []string{"isopod-mcp 0.1.0", "the plugin is 1.1.0"}}},
		{"a server that reports no version is refused", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{code: 126, stderr: []string{"unknown version", "the plugin is 0.1.0"}}},
		{"a refused server is passed over for a later one that matches", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "p"), "path", "0.2.0")
			server(t, filepath.Join(tmp, "home", ".local", "bin"), "local", "0.1.2")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{stdout: "local --x", stderr: []string{"refusing", "isopod-mcp 0.2.0"}}},
		{"the plugin-root build is checked too", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "plugin", "bin"), "plugin", "0.3.0")
			server(t, filepath.Join(tmp, "p"), "path", "0.1.0")
			return filepath.Join(tmp, "plugin"), filepath.Join(tmp, "p") + ":" + basePath
		}, want{stdout: "path --x", stderr: []string{"isopod-mcp 0.3.0"}}},
		{"the prefix the plugin is installed in", "0.1.0", func(t *testing.T, tmp string) (string, string) {
			server(t, filepath.Join(tmp, "prefix", "bin"), "prefix", "0.1.0")
			return filepath.Join(tmp, "prefix", "share", "isopod"), basePath
		}, want{stdout: "prefix --x"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.want.code != 0 && installed {
				t.Skip("isopod-mcp is installed in /usr/local/bin or /usr/bin on this host")
			}
			tmp := t.TempDir()
			home := filepath.Join(tmp, "home")
			if err := os.MkdirAll(home, 0o755); err != nil {
				t.Fatal(err)
			}
			root, path := tc.setup(t, tmp)
			plugin(t, root, tc.plugin)
			cmd := exec.Command(sh, launcher, "--x")
			cmd.Env = []string{"HOME=" + home, "CLAUDE_PLUGIN_ROOT=" + root, "PATH=" + path}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tc.want.code {
				t.Fatalf("exit %d; want %d (stderr %q)", code, tc.want.code, stderr.String())
			}
			if got := strings.TrimSpace(stdout.String()); got != tc.want.stdout {
				t.Errorf("stdout %q; want %q", got, tc.want.stdout)
			}
			for _, s := range tc.want.stderr {
				if !strings.Contains(stderr.String(), s) {
					t.Errorf("stderr %q does not say %q", stderr.String(), s)
				}
			}
		})
	}
}
