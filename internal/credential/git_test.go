package credential

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/cgi"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
)

// httpBackend is where Debian keeps git's smart HTTP server.
const httpBackend = "/usr/lib/git-core/git-http-backend"

// TestGitThroughGateway clones from and pushes to a repository served by
// git http-backend behind an HTTPS host that answers only with the
// secret, with the host's git talking to the endpoint in plain HTTP and
// never holding the secret. The push is a commit of 4 MiB of random
// data: a large request body, which git sends chunked.
func TestGitThroughGateway(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("no git")
	}
	if _, err := os.Stat(httpBackend); err != nil {
		t.Skip("no git http-backend")
	}
	git, root, bare := gitRepo(t)
	host, chunked, gzipped := gitHost(root)
	ca := newTestCA(t)
	gw := newTestGateway(t, upstreamTLS(t, ca, host), ca, map[string]string{
		"git": `{"host": "localhost", "scheme": "basic", "user": "bot", "source": "env:TOK", "ca_file": "%CA%",
			"allow": ["GET /repo.git/**", "POST /repo.git/git-upload-pack", "POST /repo.git/git-receive-pack"]}`,
	}, nil)

	// The recipe docs/credentials.md gives: the host's URLs rewritten to
	// the endpoint's.
	git(root, "config", "--global", "url."+gw.url+"/git/.insteadOf", "https://localhost/")
	work := filepath.Join(t.TempDir(), "clone")
	git(root, "clone", "-q", "https://localhost/repo.git", work)
	if b, err := os.ReadFile(filepath.Join(work, "README")); err != nil || string(b) != "hello\n" || git(work, "rev-parse", "origin/b29") == "" {
		t.Fatalf("clone: README %q, %v", b, err)
	}
	data := make([]byte, 4<<20)
	rand.Read(data)
	if err := os.WriteFile(filepath.Join(work, "blob.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	git(work, "add", "blob.bin")
	git(work, "commit", "-q", "-m", "big")
	git(work, "push", "-q", "origin", "main")
	if got, want := git(bare, "rev-parse", "main"), git(work, "rev-parse", "HEAD"); got != want {
		t.Errorf("the bare repository's main is %s; want the pushed %s", got, want)
	}
	if gzipped.Load() == 0 {
		t.Error("the host got no gzipped request; want the clone's")
	}
	if chunked.Load() < 4<<20 {
		t.Errorf("the host got %d bytes of chunked bodies; want the push's pack, over 4 MiB", chunked.Load())
	}
	gw.mu.Lock()
	defer gw.mu.Unlock()
	var up int64
	for _, e := range gw.events {
		if !e.Allowed || e.Status != 200 {
			t.Errorf("event %+v", e)
		}
		up += e.BytesUp
	}
	if up < 4<<20 {
		t.Errorf("%d request bytes through the endpoint; want the 4 MiB pushed", up)
	}
}

// gitRepo makes a bare repository of one commit, root/repo.git, that
// accepts pushes, and returns a runner of the host's git (in a home of
// its own), root and the repository.
func gitRepo(t *testing.T) (git func(dir string, args ...string) string, root, bare string) {
	t.Helper()
	root = t.TempDir()
	home := t.TempDir()
	env := append(os.Environ(), "HOME="+home, "GIT_CONFIG_NOSYSTEM=1", "GIT_TERMINAL_PROMPT=0",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.invalid", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.invalid")
	git = func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir, cmd.Env = dir, env
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return strings.TrimSpace(string(out))
	}
	bare = filepath.Join(root, "repo.git")
	git(root, "init", "-q", "--bare", "-b", "main", bare)
	git(bare, "config", "http.receivepack", "true")
	seed := t.TempDir()
	git(seed, "init", "-q", "-b", "main")
	writeFile(t, seed, "README", "hello\n", 0o644)
	git(seed, "add", "README")
	git(seed, "commit", "-q", "-m", "seed")
	// A branch of its own commit each, so that a clone's wants outgrow
	// 1 KiB, which git sends gzipped.
	var stream strings.Builder
	for i := range 30 {
		msg := fmt.Sprint("b", i)
		fmt.Fprintf(&stream, "commit refs/heads/%s\ncommitter t <t@example.invalid> 0 +0000\ndata %d\n%s\n", msg, len(msg), msg)
	}
	imp := exec.Command("git", "fast-import", "--quiet")
	imp.Dir, imp.Env, imp.Stdin = seed, env, strings.NewReader(stream.String())
	if out, err := imp.CombinedOutput(); err != nil {
		t.Fatalf("git fast-import: %v\n%s", err, out)
	}
	git(seed, "push", "-q", bare, "main", "refs/heads/b*:refs/heads/b*")

	return git, root, bare
}

// gitHost is git http-backend serving the repositories under root to
// requests with the secret (scheme basic), and counts of the bytes of
// the chunked request bodies it got and of its gzipped requests.
func gitHost(root string) (http.Handler, *atomic.Int64, *atomic.Int64) {
	backend := &cgi.Handler{Path: httpBackend, Env: []string{"GIT_PROJECT_ROOT=" + root, "GIT_HTTP_EXPORT_ALL=1"},
		InheritEnv: []string{"PATH"}}
	chunked, gzipped := new(atomic.Int64), new(atomic.Int64)
	host := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if authorised(r) != "basic" {
			http.Error(w, "no or wrong credential", http.StatusForbidden)
			return
		}
		if r.Header.Get("Content-Encoding") == "gzip" {
			gzipped.Add(1)
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
	return host, chunked, gzipped
}
