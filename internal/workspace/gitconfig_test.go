//go:build linux

package workspace

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestStripUserinfo(t *testing.T) {
	tests := []struct {
		in, want   string
		schemeless bool
	}{
		{in: "https://user:tok@github.com/o/r.git", want: "https://github.com/o/r.git"},
		{in: "https://ghp_tok@github.com/o/r", want: "https://github.com/o/r"},
		{in: "HTTP://u@h", want: "HTTP://h"},
		{in: "https://github.com/o/r@v1", want: "https://github.com/o/r@v1"},
		{in: "ssh://git@github.com/o/r", want: "ssh://git@github.com/o/r"},
		{in: "ssh://git:pw@github.com/o/r", want: "ssh://git@github.com/o/r"},
		{in: "git@github.com:o/r.git", want: "git@github.com:o/r.git"},
		{in: "user:pass@proxy:8080", want: "user:pass@proxy:8080"},
		{in: "user:pass@proxy:8080", want: "proxy:8080", schemeless: true},
		{in: "http://u:p@proxy:3128", want: "http://proxy:3128", schemeless: true},
		{in: "plain value", want: "plain value", schemeless: true},
	}
	for _, tt := range tests {
		got, changed := stripUserinfo(tt.in, tt.schemeless)
		if got != tt.want || changed != (tt.in != tt.want) {
			t.Errorf("stripUserinfo(%q, %v) = %q, %v; want %q", tt.in, tt.schemeless, got, changed, tt.want)
		}
	}
}

// TestScrubConfig rewrites a config holding every kind of credential and
// reads it back with git.
func TestScrubConfig(t *testing.T) {
	t.Parallel()
	needTools(t, "git")
	path := stageConfig(t, `[core]
	repositoryformatversion = 0
	bare
[remote "origin"]
	url = https://x-access-token:`+secretToken+`@github.com/o/r.git
	fetch = +refs/heads/*:refs/remotes/origin/*
	pushurl = git@github.com:o/r.git
[http "https://github.com/"]
	extraheader = `+secretHeader+`
	sslVerify = true
[http]
	proxy = http://u:`+secretToken+`@proxy:3128
	extraHeader = X-Other: `+secretToken+`
[credential]
	helper = store
[credential "https://`+secretToken+`@example.com"]
	username = me
[url "https://`+secretToken+`@github.com/"]
	insteadOf = https://github.com/
[sendemail]
	smtpPass = `+secretToken+`
[alias]
	quoted = "!echo \"a\\tb\" ; # not a comment"
`, 0o640)
	removed := scrubStaged(t, path)
	want := []string{
		"remote.origin.url (user info)",
		"http.https://github.com/.extraheader",
		"http.proxy (user info)",
		"http.extraheader",
		"credential.helper",
		"credential.https://example.com (user info in its name)",
		"credential.https://example.com.username",
		"url.https://github.com/ (user info in its name)",
		"sendemail.smtppass",
	}
	// The name of a changed subsection is reported with its key.
	want[5] = "credential.https://example.com.username (user info in its name)"
	want[7] = "url.https://github.com/.insteadof (user info in its name)"
	if !reflect.DeepEqual(removed, want) {
		t.Errorf("removed:\n%q\nwant\n%q", removed, want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), secretToken) || strings.Contains(string(b), secretHeader) {
		t.Errorf("a secret survived:\n%s", b)
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o640 {
		t.Errorf("mode %v; want 0640 kept", fi.Mode())
	}
	got := gitIn(t, filepath.Dir(path), "config", "--file", path, "--list")
	wantList := strings.Join([]string{
		"core.repositoryformatversion=0",
		"core.bare",
		"remote.origin.url=https://github.com/o/r.git",
		"remote.origin.fetch=+refs/heads/*:refs/remotes/origin/*",
		"remote.origin.pushurl=git@github.com:o/r.git",
		"http.https://github.com/.sslverify=true",
		"http.proxy=http://proxy:3128",
		"url.https://github.com/.insteadof=https://github.com/",
		"alias.quoted=!echo \"a\\tb\" ; # not a comment",
	}, "\n") + "\n"
	if got != wantList {
		t.Errorf("the scrubbed config reads back as\n%s\nwant\n%s", got, wantList)
	}
}

// TestScrubConfigClean leaves a config without credentials byte for byte.
func TestScrubConfigClean(t *testing.T) {
	t.Parallel()
	needTools(t, "git")
	body := "# a comment\n[core]\n\tbare = false\n[remote \"origin\"]\n\turl = git@github.com:o/r.git\n"
	path := stageConfig(t, body, 0o644)
	if removed := scrubStaged(t, path); removed != nil {
		t.Fatalf("scrubConfigs = %q; want nothing removed", removed)
	}
	if b, _ := os.ReadFile(path); string(b) != body {
		t.Errorf("a clean config was rewritten:\n%s", b)
	}
}

// stageConfig writes body as .git/config of a new staging copy holding a
// git directory, and returns the config's path.
func stageConfig(t *testing.T, body string, mode os.FileMode) string {
	t.Helper()
	stage := t.TempDir()
	write(t, filepath.Join(stage, ".git/HEAD"), "ref: refs/heads/main\n", 0o644)
	if err := os.Mkdir(filepath.Join(stage, ".git/objects"), 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(stage, ".git/config")
	write(t, path, body, mode)
	return path
}

// scrubStaged cleans the config stageConfig wrote and returns what it
// removed.
func scrubStaged(t *testing.T, path string) []string {
	t.Helper()
	stage := filepath.Dir(filepath.Dir(path))
	sc, err := scrubConfigs(t.Context(), gitPath(), stage, "", []string{".git/config"})
	if err != nil {
		t.Fatal(err)
	}
	return sc.names
}
