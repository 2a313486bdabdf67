package credentials

import (
	"bytes"
	"io"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// httpBackend is where Debian keeps git's smart HTTP server.
const httpBackend = "/usr/lib/git-core/git-http-backend"

// gitAlias reaches the repository at localhost/repo.git with the secret
// as basic auth, for git's smart HTTP paths only.
const gitAlias = `{"host": "localhost", "scheme": "basic", "user": "bot", "source": "env:` + tokenEnv + `", "ca_file": "%CA%",
	"allow": ["GET /repo.git/info/refs", "POST /repo.git/git-upload-pack", "POST /repo.git/git-receive-pack"]}`

// gitGuest is the recipe of docs/credentials.md: the remote is written
// https://localhost/repo.git and rewritten to the endpoint. The guest
// clones, commits 4 MiB of random data (a pack git sends chunked) and
// pushes, then looks for the secret.
const gitGuest = `set -e
export HOME=${HOME:-/root}
git config --global user.name guest
git config --global user.email guest@example.invalid
git config --global url."$ISOPOD_CREDENTIAL_ENDPOINT/git/".insteadOf https://localhost/
git clone -q https://localhost/repo.git /root/w
cd /root/w
echo "readme=$(cat README)"
echo "remote=$(git config remote.origin.url)"
echo "geturl=$(git remote get-url origin)"
head -c 4194304 /dev/urandom > blob.bin
git add blob.bin
git commit -q -m big
git push -q origin main
echo "head=$(git rev-parse HEAD)"
set +e
` + secretProbe

// TestInjectGit: git in the guest clones from and pushes to a repository
// served by git http-backend behind an HTTPS host that answers only with
// the secret; the push lands in the host's bare repository, and the
// secret is in neither the guest nor the report nor the state root.
func TestInjectGit(t *testing.T) {
	e2e.RequireDebian(t)
	if _, err := os.Stat(httpBackend); err != nil {
		t.Skip("no git http-backend on the host")
	}
	root, bare := bareRepo(t)
	var chunked atomic.Int64
	up := startUpstreamWith(t, gitBackend(t, root, &chunked))
	writeStore(t, up, 0o600, map[string]string{"git": gitAlias})
	start := time.Now()
	r := e2e.Isopod(t, []string{tokenEnv + "=" + secret}, "run", "--base", "base-debian", "--inject", "git", "--timeout-s", "900",
		"--env", "A="+secretA, "--env", "B="+secretB, "--", "sh", "-c", gitGuest)
	if r.Code != 0 || r.JSON["ok"] != true || r.JSON["exit_code"] != float64(0) {
		t.Fatalf("isopod run --inject git:\n%s", r)
	}
	out := e2e.Str(r.JSON, "stdout")
	for _, want := range []string{"readme=hello\n", "remote=https://localhost/repo.git\n", "geturl=http://10.0.2.1:3129/git/repo.git\n", "envhits=0\n", "procenv=0\n", "done\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q:\n%s\nstderr: %s", want, out, e2e.Str(r.JSON, "stderr"))
		}
	}
	if strings.Contains(out, "filehit=") {
		t.Errorf("the secret is in guest files:\n%s", out)
	}
	_, head, _ := strings.Cut(out, "head=")
	head, _, _ = strings.Cut(head, "\n")
	if got := hostGit(t, bare, "rev-parse", "main"); head == "" || got != head {
		t.Errorf("the bare repository's main is %s; want the pushed %q", got, head)
	}
	if got := hostGit(t, bare, "log", "-1", "--format=%s", "main"); got != "big" {
		t.Errorf("last commit %q; want the pushed \"big\"", got)
	}
	if got := hostGit(t, bare, "cat-file", "-s", "main:blob.bin"); got != "4194304" {
		t.Errorf("blob.bin is %s bytes in the bare repository; want 4194304", got)
	}
	if chunked.Load() < 4<<20 {
		t.Errorf("the host got %d bytes of chunked bodies; want the push's pack, over 4 MiB", chunked.Load())
	}
	checkGitEgress(t, r.JSON)
	if strings.Contains(string(r.Stdout)+string(r.Stderr), secret) {
		t.Error("the secret is in isopod's output")
	}
	if hits := filesHolding(t, e2e.HomeDir, start, []byte(secret)); len(hits) > 0 {
		t.Errorf("the secret is in the state root: %v", hits)
	}
}

// checkGitEgress: every endpoint request was allowed and answered 200,
// and a git-receive-pack POST carried the pack up.
func checkGitEgress(t *testing.T, rep map[string]any) {
	t.Helper()
	eg, _ := rep["egress"].(map[string]any)
	allowed, _ := eg["allowed"].([]any)
	var up float64
	n := 0
	for _, e := range allowed {
		ev, _ := e.(map[string]any)
		if ev["proto"] != "credential" {
			continue
		}
		n++
		if ev["status"] != float64(200) || ev["alias"] != "git" {
			t.Errorf("endpoint request %v; want alias git, status 200", ev)
		}
		if ev["path"] == "/repo.git/git-receive-pack" {
			up, _ = ev["bytes_up"].(float64)
		}
	}
	if n < 4 {
		t.Errorf("%d endpoint requests recorded; want a clone's and a push's, 4 at least: %v", n, allowed)
	}
	if up < 4<<20 {
		t.Errorf("the push sent %v bytes up; want the 4 MiB pack", up)
	}
	if denied, _ := eg["denied"].([]any); len(denied) > 0 {
		t.Errorf("denied: %v", denied)
	}
}

// bareRepo makes root/repo.git, a bare repository of one commit on main
// holding README, that accepts pushes over HTTP.
func bareRepo(t *testing.T) (root, bare string) {
	t.Helper()
	root = t.TempDir()
	bare = filepath.Join(root, "repo.git")
	hostGit(t, root, "init", "-q", "--bare", "-b", "main", bare)
	hostGit(t, bare, "config", "http.receivepack", "true")
	seed := t.TempDir()
	hostGit(t, seed, "init", "-q", "-b", "main")
	if err := os.WriteFile(filepath.Join(seed, "README"), []byte("hello\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	hostGit(t, seed, "add", "README")
	hostGit(t, seed, "commit", "-q", "-m", "seed")
	hostGit(t, seed, "push", "-q", bare, "main")
	return root, bare
}

// hostGit runs the host's git in dir, with no user or system settings,
// and returns its output trimmed.
func hostGit(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "HOME="+dir, "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// gitBackend is git http-backend serving the repositories under root to
// requests that carry the secret as basic auth for user bot; any other
// gets 401. It counts the bytes of chunked request bodies in chunked.
func gitBackend(t *testing.T, root string, chunked *atomic.Int64) http.Handler {
	t.Helper()
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git on the host")
	}
	backend := &cgi.Handler{Path: httpBackend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
		InheritEnv: []string{"PATH"}}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "bot" || p != secret {
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		if r.ContentLength < 0 { // net/http/cgi takes no chunked body: read it whole first
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			chunked.Add(int64(len(b)))
			r.Body, r.ContentLength, r.TransferEncoding = io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
		}
		backend.ServeHTTP(w, r)
	})
}
