package credential

import (
	"archive/zip"
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestPipThroughGateway downloads a wheel from a package index that
// answers only with the secret, with the recipe docs/credentials.md
// gives: pip's index URL the endpoint's, the index's links relative.
func TestPipThroughGateway(t *testing.T) {
	if testing.Short() {
		t.Skip("runs pip")
	}
	if err := exec.Command("python3", "-m", "pip", "--version").Run(); err != nil {
		t.Skip("no pip")
	}
	const wheel = "demo-1.0-py3-none-any.whl"
	whl := demoWheel(t)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/demo/", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `<!DOCTYPE html><html><body><a href="../../files/%s">%s</a></body></html>`, wheel, wheel)
	})
	mux.HandleFunc("GET /files/"+wheel, func(w http.ResponseWriter, r *http.Request) { w.Write(whl) })
	host := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authorised(r) != "bearer" {
			http.Error(w, "no or wrong credential", http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r)
	})
	ca := newTestCA(t)
	gw := newTestGateway(t, upstreamTLS(t, ca, host), ca, map[string]string{
		"pypi": `{"host": "localhost", "scheme": "bearer", "source": "env:TOK", "ca_file": "%CA%", "allow": ["GET /simple/**", "GET /files/*"]}`,
	}, nil)
	dest := t.TempDir()
	cmd := exec.Command("python3", "-m", "pip", "download", "--isolated", "--disable-pip-version-check", "--no-cache-dir",
		"--no-deps", "--only-binary", ":all:", "--index-url", gw.url+"/pypi/simple/", "--trusted-host", gw.url[len("http://"):],
		"-d", dest, "demo==1.0")
	cmd.Env = append(os.Environ(), "PIP_CONFIG_FILE=/dev/null", "HOME="+t.TempDir())
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip download: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(filepath.Join(dest, wheel)); err != nil || !bytes.Equal(b, whl) {
		t.Errorf("downloaded wheel: %d bytes, %v; want the index's %d", len(b), err, len(whl))
	}
}

// demoWheel is a minimal wheel of package demo 1.0.
func demoWheel(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	z := zip.NewWriter(&b)
	for name, content := range map[string]string{
		"demo/__init__.py":                 "",
		"demo-1.0.dist-info/METADATA":      "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n",
		"demo-1.0.dist-info/WHEEL":         "Wheel-Version: 1.0\nGenerator: isopod-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"demo-1.0.dist-info/RECORD":        "",
		"demo-1.0.dist-info/top_level.txt": "demo\n",
	} {
		w, err := z.Create(name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(content))
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
