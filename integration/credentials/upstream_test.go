package credentials

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/credential"
	"isopod/internal/testnet"
)

// The secret's two halves: commands in the guest join them, so that the
// whole secret is in no command line, report or file the test writes.
const (
	secretA = "e2e-cred-9c41"
	secretB = "-only-on-the-host-7d2e"
	secret  = secretA + secretB
	// tokenEnv is the variable the store's alias reads its secret from.
	tokenEnv = "CRED_E2E_TOKEN"
)

// upstream is an HTTPS server for host localhost on 127.0.0.1:443, with a
// CA of its own: it answers "upstream:<path>" to a request carrying the
// secret as a bearer token, 401 to any other.
type upstream struct {
	caFile string
}

// startUpstream starts the server, or skips when port 443 is taken (the
// gateway dials the alias's host on 443, and localhost resolves to
// 127.0.0.1 on the host).
func startUpstream(t *testing.T) *upstream {
	t.Helper()
	return startUpstreamWith(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+secret {
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		fmt.Fprintf(w, "upstream:%s", r.URL.Path)
	}))
}

// startUpstreamWith is startUpstream serving h, which checks the secret
// itself.
func startUpstreamWith(t *testing.T, h http.Handler) *upstream {
	t.Helper()
	ca := testnet.NewCA(t)
	leaf := ca.Leaf(t, "localhost", "127.0.0.1")
	l, err := tls.Listen("tcp", "127.0.0.1:443", &tls.Config{Certificates: []tls.Certificate{leaf}})
	if err != nil {
		t.Skipf("the upstream needs 127.0.0.1:443: %v", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: h}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	up := &upstream{caFile: filepath.Join(t.TempDir(), "ca.pem")}
	pemCA := ca.PEM
	if err := os.WriteFile(up.caFile, pemCA, 0o600); err != nil {
		t.Fatal(err)
	}
	return up
}

// storePath is the private state root's credential store.
func storePath() string { return filepath.Join(e2e.HomeDir, credential.StoreFile) }

// writeStore writes the store with the aliases given as JSON objects
// (%CA% is replaced by the upstream's CA file) and mode perm; it is
// removed when the test ends.
func writeStore(t *testing.T, up *upstream, perm os.FileMode, aliases map[string]string) {
	t.Helper()
	var parts []string
	for name, a := range aliases {
		ca := ""
		if up != nil {
			ca = up.caFile
		}
		parts = append(parts, fmt.Sprintf("%q: %s", name, strings.ReplaceAll(a, "%CA%", ca)))
	}
	body := `{"version": 1, "credentials": {` + strings.Join(parts, ", ") + `}}`
	if err := os.WriteFile(storePath(), []byte(body), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(storePath(), perm); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(storePath()) })
}

// upAlias is the alias of the upstream: GET under /ok/ only.
const upAlias = `{"host": "localhost", "scheme": "bearer", "source": "env:` + tokenEnv + `", "ca_file": "%CA%", "allow": ["GET /ok/**"]}`

// vmCount is how many VM records the state root holds.
func vmCount(t *testing.T) int {
	t.Helper()
	es, err := os.ReadDir(filepath.Join(e2e.HomeDir, "vms"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	return len(es)
}

// filesHolding lists the regular files under root written since since
// that contain needle (symbolic links are not followed: the state root's
// links name the user's images, which no run writes).
func filesHolding(t *testing.T, root string, since time.Time, needle []byte) []string {
	t.Helper()
	var hits []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return nil
		}
		if st, err := d.Info(); err != nil || st.ModTime().Before(since) {
			return nil
		}
		if fileContains(t, path, needle) {
			hits = append(hits, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return hits
}

// fileContains reads path in chunks that overlap by len(needle)-1.
func fileContains(t *testing.T, path string, needle []byte) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	buf := make([]byte, 0, 1<<20+len(needle))
	chunk := make([]byte, 1<<20)
	for {
		n, err := r.Read(chunk)
		buf = append(buf, chunk[:n]...)
		if bytes.Contains(buf, needle) {
			return true
		}
		if keep := len(needle) - 1; len(buf) > keep {
			buf = append(buf[:0], buf[len(buf)-keep:]...)
		}
		if err == io.EOF {
			return false
		}
		if err != nil {
			t.Errorf("reading %s: %v", path, err)
			return false
		}
	}
}

// fsMode is perm as a file mode.
func fsMode(perm uint32) os.FileMode { return os.FileMode(perm) }
