package credential

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"isopod/internal/errdefs"
)

// writeFile writes content at dir/name with mode and returns its path.
func writeFile(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	return p
}

// storeWith is a store of one alias "gh" whose declaration is decl.
func storeWith(decl string) string {
	return `{"version": 1, "credentials": {"gh": ` + decl + `}}`
}

// TestLoad checks a valid store: names lower-cased, host normalised,
// rules parsed, a header name canonical.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	p := writeFile(t, dir, StoreFile, `{"version": 1, "credentials": {
		"GH": {"host": "API.GitHub.com.", "scheme": "bearer", "source": "env:GH_TOKEN", "allow": ["readonly", "POST,PATCH /repos/*/issues/**"], "mcp": true},
		"pypi": {"host": "pypi.example", "scheme": "basic", "user": "__token__", "source": "file:/run/secret", "allow": ["GET /simple/**"]},
		"key": {"host": "localhost", "scheme": "header", "header": "x-api-key", "source": "env:K", "allow": ["DELETE /"]}}}`, 0o600)
	st, err := Load(p)
	if err != nil {
		t.Fatal(err)
	}
	gh := st.Aliases["gh"]
	if gh.Name != "gh" || gh.Host != "api.github.com" || gh.Scheme != SchemeBearer || !gh.MCP || len(gh.Allow) != 2 {
		t.Errorf("gh: %+v", gh)
	}
	if r := gh.Allow[1]; !slices.Equal(r.Methods, []string{"POST", "PATCH"}) || r.Pattern != "/repos/*/issues/**" {
		t.Errorf("gh's second rule %+v", r)
	}
	if k := st.Aliases["key"]; k.Header != "X-Api-Key" || k.Host != "localhost" {
		t.Errorf("key: %+v", k)
	}
	if u := st.Aliases["pypi"]; u.User != "__token__" || u.MCP {
		t.Errorf("pypi: %+v", u)
	}
}

// TestLoadRefusals checks every refusal of the store: each is
// failed_precondition and names the file and the fix.
func TestLoadRefusals(t *testing.T) {
	ok := `{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"]}`
	for _, tt := range []struct {
		name, content, want string
	}{
		{"unknown top field", `{"version": 1, "credentials": {}, "extra": 1}`, `unknown field "extra"`},
		{"unknown alias field", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"], "token": "x"}`), `alias "gh": json: unknown field "token"`},
		{"no version", `{"credentials": {}}`, `"version": 1`},
		{"version 2", `{"version": 2, "credentials": {}}`, "version 2"},
		{"not json", `{"version": 1,`, "fix its JSON"},
		{"trailing text", `{"version": 1, "credentials": {}} {}`, "text after"},
		{"bad alias name", `{"version": 1, "credentials": {"a.b": ` + ok + `}}`, "letters, digits"},
		{"alias twice", `{"version": 1, "credentials": {"gh": ` + ok + `, "gh": ` + ok + `}}`, "declared twice"},
		{"credentials not an object", `{"version": 1, "credentials": []}`, "not an object"},
		{"alias twice by case", `{"version": 1, "credentials": {"gh": ` + ok + `, "GH": ` + ok + `}}`, "declared twice"},
		{"no host", storeWith(`{"scheme": "bearer", "source": "env:T", "allow": ["readonly"]}`), `"host": missing`},
		{"wildcard host", storeWith(`{"host": "*.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"]}`), "one exact host"},
		{"host with port", storeWith(`{"host": "api.example:443", "scheme": "bearer", "source": "env:T", "allow": ["readonly"]}`), "one exact host"},
		{"bad scheme", storeWith(`{"host": "api.example", "scheme": "digest", "source": "env:T", "allow": ["readonly"]}`), `"bearer", "basic" or "header"`},
		{"basic without user", storeWith(`{"host": "api.example", "scheme": "basic", "source": "env:T", "allow": ["readonly"]}`), `"user" missing`},
		{"basic user with colon", storeWith(`{"host": "api.example", "scheme": "basic", "user": "a:b", "source": "env:T", "allow": ["readonly"]}`), `without ':'`},
		{"user on bearer", storeWith(`{"host": "api.example", "scheme": "bearer", "user": "u", "source": "env:T", "allow": ["readonly"]}`), "basic only"},
		{"header missing", storeWith(`{"host": "api.example", "scheme": "header", "source": "env:T", "allow": ["readonly"]}`), `"header" missing`},
		{"header Host", storeWith(`{"host": "api.example", "scheme": "header", "header": "host", "source": "env:T", "allow": ["readonly"]}`), "not a header name"},
		{"header Content-Length", storeWith(`{"host": "api.example", "scheme": "header", "header": "Content-Length", "source": "env:T", "allow": ["readonly"]}`), "not a header name"},
		{"header Transfer-Encoding", storeWith(`{"host": "api.example", "scheme": "header", "header": "transfer-encoding", "source": "env:T", "allow": ["readonly"]}`), "not a header name"},
		{"header Connection", storeWith(`{"host": "api.example", "scheme": "header", "header": "Connection", "source": "env:T", "allow": ["readonly"]}`), "not a header name"},
		{"header not a token", storeWith(`{"host": "api.example", "scheme": "header", "header": "X Key", "source": "env:T", "allow": ["readonly"]}`), "not a header name"},
		{"header on bearer", storeWith(`{"host": "api.example", "scheme": "bearer", "header": "X-K", "source": "env:T", "allow": ["readonly"]}`), "header only"},
		{"bad source", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "vault:x", "allow": ["readonly"]}`), "env:NAME or file:"},
		{"relative file source", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "file:tok", "allow": ["readonly"]}`), "absolute"},
		{"bad env name", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:A-B", "allow": ["readonly"]}`), "names a variable"},
		{"no allow", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T"}`), `"allow": missing`},
		{"empty allow", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": []}`), `"allow": missing`},
		{"bad allow", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["GET /a/../b"]}`), `".." segment`},
		{"relative ca_file", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"], "ca_file": "ca.pem"}`), "absolute"},
		{"missing ca_file", storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"], "ca_file": "/nonexistent/ca.pem"}`), "readable PEM"},
		{"too big", `{"version": 1, "credentials": {}}` + strings.Repeat(" ", MaxFileSize), "over the limit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := writeFile(t, t.TempDir(), StoreFile, tt.content, 0o600)
			checkStoreRefusal(t, p, tt.want)
		})
	}
}

// checkStoreRefusal checks that Load refuses the store at p as
// failed_precondition with an error naming p and holding want.
func checkStoreRefusal(t *testing.T, p, want string) {
	t.Helper()
	_, err := Load(p)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("Load: %v; want failed_precondition", err)
	}
	if !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), want) {
		t.Errorf("Load: %v; want it to name %s and say %q", err, p, want)
	}
}

// TestLoadFileRefusals checks the store file's own checks: mode, symbolic
// link, owner, not a regular file.
func TestLoadFileRefusals(t *testing.T) {
	content := `{"version": 1, "credentials": {}}`
	t.Run("group readable", func(t *testing.T) {
		p := writeFile(t, t.TempDir(), StoreFile, content, 0o640)
		checkStoreRefusal(t, p, "chmod 600 "+p)
	})
	t.Run("other readable", func(t *testing.T) {
		p := writeFile(t, t.TempDir(), StoreFile, content, 0o604)
		checkStoreRefusal(t, p, "chmod 600")
	})
	t.Run("symlink", func(t *testing.T) {
		dir := t.TempDir()
		target := writeFile(t, dir, "real.json", content, 0o600)
		link := filepath.Join(dir, StoreFile)
		if err := os.Symlink(target, link); err != nil {
			t.Fatal(err)
		}
		checkStoreRefusal(t, link, "symbolic link")
	})
	t.Run("directory", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), StoreFile)
		if err := os.Mkdir(p, 0o700); err != nil {
			t.Fatal(err)
		}
		checkStoreRefusal(t, p, "not a regular file")
	})
	t.Run("other owner", func(t *testing.T) {
		if os.Getuid() != 0 {
			t.Skip("needs root to give a file to another user")
		}
		p := writeFile(t, t.TempDir(), StoreFile, content, 0o600)
		if err := os.Chown(p, 12345, 12345); err != nil {
			t.Fatal(err)
		}
		checkStoreRefusal(t, p, "owned by uid 12345")
	})
	t.Run("ca_file not PEM", func(t *testing.T) {
		dir := t.TempDir()
		ca := writeFile(t, dir, "ca.pem", "not a certificate\n", 0o644)
		p := writeFile(t, dir, StoreFile, storeWith(`{"host": "api.example", "scheme": "bearer", "source": "env:T", "allow": ["readonly"], "ca_file": "`+ca+`"}`), 0o600)
		checkStoreRefusal(t, p, "no PEM certificate")
	})
	t.Run("valid", func(t *testing.T) {
		p := writeFile(t, t.TempDir(), StoreFile, content, 0o600)
		if _, err := Load(p); err != nil {
			t.Fatal(err)
		}
	})
}

// TestCheckHost checks the host forms refused and the normalisation.
func TestCheckHost(t *testing.T) {
	for in, want := range map[string]string{
		"api.github.com": "api.github.com", "API.Example.": "api.example", "localhost": "localhost",
		"a-b.example": "a-b.example", "x1.example9": "x1.example9",
	} {
		if got, err := checkHost(in); err != nil || got != want {
			t.Errorf("checkHost(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"", "*.example", "*", "api.example:443", "127.0.0.1", "[::1]", "::1", "2852039166",
		"0xa9fea9fe", "127.1", "0177.0.0.1", "api.123", "api.0x1f", "a..b", "a b.example", "-a.example",
		"user@api.example", "api.example/path", "169.254.169.254", "0x"} {
		if got, err := checkHost(in); err == nil {
			t.Errorf("checkHost(%q) = %q; want refused", in, got)
		}
	}
}

// TestParseRule checks allow entries accepted and refused.
func TestParseRule(t *testing.T) {
	for _, ok := range []string{"readonly", "GET /", "GET /**", "GET,HEAD /a/*/c", "DELETE /a/b", "PUT /a/b:c/@d/**"} {
		if _, err := ParseRule(ok); err != nil {
			t.Errorf("ParseRule(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "read-only", "none", "get /a", "GET", "GET a", "GET  /a", "GET /a/", "GET //a",
		"GET /a/./b", "GET /a/../b", "GET /a*", "GET /a/b*c", "GET /**/a", "GET /a?b", "GET /a#b", "GET /a%2fb",
		`GET /a\b`, "GET /a b", "CONNECT /a", "GET,GET /a", "GET, POST /a", "OPTIONS /", "GET /a/***"} {
		if r, err := ParseRule(bad); err == nil {
			t.Errorf("ParseRule(%q) = %+v; want refused", bad, r)
		}
	}
}

// TestPermits checks how a rule matches a method and a normalised path.
func TestPermits(t *testing.T) {
	for _, tt := range []struct {
		rule, method, path string
		want               bool
	}{
		{"readonly", "GET", "/", true},
		{"readonly", "HEAD", "/a/b/", true},
		{"readonly", "POST", "/a", false},
		{"GET /", "GET", "/", true},
		{"GET /", "GET", "/a", false},
		{"GET /a/*", "GET", "/a/b", true},
		{"GET /a/*", "GET", "/a/", false},
		{"GET /a/*", "GET", "/a/b/c", false},
		{"GET /a/*", "GET", "/a", false},
		{"GET /a/**", "GET", "/a", true},
		{"GET /a/**", "GET", "/a/", true},
		{"GET /a/**", "GET", "/a/b/c/", true},
		{"GET /a/**", "GET", "/ab", false},
		{"GET /a/b", "GET", "/a/b/", false},
		{"GET /a/b", "GET", "/A/b", false},
		{"POST,PUT /repo.git/git-receive-pack", "PUT", "/repo.git/git-receive-pack", true},
		{"POST,PUT /repo.git/git-receive-pack", "get", "/repo.git/git-receive-pack", false},
	} {
		r, err := ParseRule(tt.rule)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Permits(tt.method, tt.path); got != tt.want {
			t.Errorf("%q permits %s %s: %v; want %v", tt.rule, tt.method, tt.path, got, tt.want)
		}
	}
}
