package workspace

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"isopod/integration/e2e"
)

// secretIncluded is planted in files the fixture's git config includes
// and in credential stores kept in .git.
const secretIncluded = "included-s3cr3t-9023"

// The guest's git reads no credential through an include: an include
// naming a file in .git is inlined (less its credentials), one naming a
// file elsewhere is dropped, and neither the included files nor the
// credential stores in .git reach the guest. The report names each.
func TestWorkspaceGitIncludes(t *testing.T) {
	e2e.RequireDebian(t)
	f := newFixture(t)
	gitDir := filepath.Join(f.Dir, ".git")
	outside := filepath.Join(t.TempDir(), "out.inc")
	write(t, outside, "[http]\n\textraHeader = "+secretIncluded+"\n", 0o644)
	cfg, err := os.ReadFile(filepath.Join(gitDir, "config"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(gitDir, "config"), string(cfg)+`[Include]
	Path = team.inc
[includeIf "gitdir:/"]
	path = `+outside+`
[include]
	path = `+filepath.Join(gitDir, "abs.inc")+`
[credential "https://y.example"]
	helper = store --file=.git/store
`, 0o644)
	write(t, filepath.Join(gitDir, "team.inc"), "[user]\n\tname = from-team\n[http]\n\textraHeader = "+secretIncluded+
		"\n[include]\n\tpath = \"sub/deeper.inc\"\n", 0o600)
	write(t, filepath.Join(gitDir, "sub/deeper.inc"), "[remote \"origin\"]\n\tpushurl = https://me:"+secretIncluded+"@x.example/r.git\n", 0o600)
	write(t, filepath.Join(gitDir, "abs.inc"), "[core]\n\tabbrev = 12\n[sendemail]\n\tsmtpPass = "+secretIncluded+"\n", 0o600)
	for _, store := range []string{"credentials", "store"} {
		write(t, filepath.Join(gitDir, store), "https://me:"+secretIncluded+"@x.example\n", 0o600)
	}
	// The host's git reads it all.
	if list := git(t, f.Dir, "config", "--list"); !strings.Contains(list, secretIncluded) {
		t.Fatalf("the host's git does not read the includes:\n%s", list)
	}
	before := snapshot(t, f.Dir)

	script := `
echo "== config =="; git config --list --show-origin 2>&1
echo "== secret =="; grep -rlF ` + secretIncluded + ` /workspace; true
echo "== files =="
for p in team.inc sub/deeper.inc abs.inc credentials store; do [ -e ".git/$p" ] && echo "$p"; done; true
echo "== status =="; git status --porcelain 2>&1
`
	r := run(t, nil, "--base", "base-debian", "--no-network", "--workspace", f.Dir,
		"--stdin-file", stdinScript(t, script), "--", "sh", "-c", guestScript)
	s := sections(e2e.Str(r.JSON, "stdout"))
	config := s["config"]
	for _, want := range []string{"file:.git/config\tuser.name=from-team\n", "file:.git/config\tcore.abbrev=12\n",
		"file:.git/config\tremote.origin.pushurl=https://x.example/r.git\n"} {
		if !strings.Contains(config, want) {
			t.Errorf("the guest's git config lacks %q:\n%s", want, config)
		}
	}
	for _, line := range strings.SplitAfter(config, "\n") {
		if strings.HasPrefix(line, "file:.git/") && !strings.HasPrefix(line, "file:.git/config\t") {
			t.Errorf("the guest's git reads a file in .git besides its config: %q", line)
		}
	}
	for _, bad := range []string{secretIncluded, "include", "credential", "extraheader", "smtppass", outside} {
		if strings.Contains(strings.ToLower(config), strings.ToLower(bad)) {
			t.Errorf("the guest's git config holds %q:\n%s", bad, config)
		}
	}
	if s["secret"] != "" || s["files"] != "" {
		t.Errorf("in the guest: files holding the secret %q; included files and stores %q; want none", s["secret"], s["files"])
	}
	if s["status"] != "?? notes.txt\n" {
		t.Errorf("git status in the guest: %q", s["status"])
	}
	w := wsReport(t, r)
	var names []string
	for _, n := range w["credentials_removed"].([]any) {
		names = append(names, n.(string))
	}
	for _, want := range []string{
		"include.path (inlined: .git/team.inc)",
		".git/team.inc: include.path (inlined: .git/sub/deeper.inc)",
		"includeif.gitdir:/.path (outside the git directory, dropped)",
		"include.path (inlined: .git/abs.inc)",
		".git/team.inc: http.extraheader",
		".git/sub/deeper.inc: remote.origin.pushurl (user info)",
		".git/abs.inc: sendemail.smtppass",
		"credential.https://y.example.helper",
		".git/team.inc (included, left out)",
		".git/sub/deeper.inc (included, left out)",
		".git/abs.inc (included, left out)",
		".git/credentials (a credential store, left out)",
		".git/store (named by credential.https://y.example.helper, left out)",
	} {
		if !slices.Contains(names, want) {
			t.Errorf("credentials_removed lacks %q:\n%s", want, strings.Join(names, "\n"))
		}
	}
	if bytes.Contains(r.Stdout, []byte(secretIncluded)) || bytes.Contains(r.Stdout, []byte(outside)) {
		t.Errorf("the report quotes a secret or an include's value:\n%s", r.Stdout)
	}
	sameSnapshot(t, "the host fixture", before, snapshot(t, f.Dir))
}
