package credential

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNpmThroughGateway reads a package's metadata from a registry that
// answers only with the secret, with the .npmrc docs/credentials.md
// gives.
func TestNpmThroughGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs npm")
	}
	if _, err := exec.LookPath("npm"); err != nil {
		t.Skip("no npm")
	}
	host := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authorised(r) != "header" {
			http.Error(w, "no or wrong credential", http.StatusForbidden)
			return
		}
		if r.URL.Path != "/demo" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"name": "demo", "dist-tags": {"latest": "1.2.3"}, "versions": {"1.2.3": {"name": "demo", "version": "1.2.3",
			"dist": {"tarball": "https://localhost/demo/-/demo-1.2.3.tgz", "shasum": "0000000000000000000000000000000000000000"}}}}`))
	})
	ca := newTestCA(t)
	gw := newTestGateway(t, upstreamTLS(t, ca, host), ca, map[string]string{
		"npm": `{"host": "localhost", "scheme": "header", "header": "X-Api-Key", "source": "env:TOK", "ca_file": "%CA%", "allow": ["GET /*"]}`,
	}, nil)
	home := t.TempDir()
	writeFile(t, home, ".npmrc", "registry=${"+EndpointEnv+"}/npm/\n", 0o644)
	cmd := exec.Command("npm", "view", "demo", "version", "--cache", filepath.Join(home, "cache"))
	cmd.Dir = home
	cmd.Env = append(os.Environ(), "HOME="+home, "NPM_CONFIG_USERCONFIG="+filepath.Join(home, ".npmrc"), EndpointEnv+"="+gw.url,
		"NPM_CONFIG_UPDATE_NOTIFIER=false")
	out, err := cmd.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "1.2.3" {
		t.Fatalf("npm view: %v\n%s", err, out)
	}
}
