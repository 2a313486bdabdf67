package version

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	releaseRE = regexp.MustCompile(`^[0-9]+\.[0-9]+\.[0-9]+$`)
	suffixRE  = regexp.MustCompile(`^(\+[0-9A-Za-z.-]+)?$`)
)

func TestVersionShape(t *testing.T) {
	if !releaseRE.MatchString(Release()) {
		t.Errorf("VERSION holds %q; want MAJOR.MINOR.PATCH", Release())
	}
	if !strings.HasPrefix(String(), Release()) || !suffixRE.MatchString(strings.TrimPrefix(String(), Release())) {
		t.Errorf("String() = %q; want %q and at most a +build suffix", String(), Release())
	}
}

// TestPluginManifestAgrees: the plugin declares the same version as
// VERSION, and the marketplace entry declares none (one place to bump).
func TestPluginManifestAgrees(t *testing.T) {
	root := filepath.Join("..", "..")
	var plugin struct {
		Version string `json:"version"`
	}
	readJSON(t, filepath.Join(root, ".claude-plugin", "plugin.json"), &plugin)
	if plugin.Version != Release() {
		t.Errorf(".claude-plugin/plugin.json version %q; want %q from internal/version/VERSION", plugin.Version, Release())
	}
	var market map[string]any
	readJSON(t, filepath.Join(root, ".claude-plugin", "marketplace.json"), &market)
	if _, ok := market["version"]; ok {
		t.Error("marketplace.json declares a version; it must carry none")
	}
	plugins, _ := market["plugins"].([]any)
	if len(plugins) == 0 {
		t.Fatal("marketplace.json lists no plugin")
	}
	for _, p := range plugins {
		if m, _ := p.(map[string]any); m["version"] != nil {
			t.Errorf("marketplace entry %v declares a version; it must carry none", m["name"])
		}
	}
}

func readJSON(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
