//go:build linux

package workspace

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// secretInc is planted in the files a repository's config includes, in
// credential stores and in files a credential helper names.
const secretInc = "INCLUDED-s3cr3t-4417"

// includeRepo makes a repository whose config includes files in .git
// (relatively, through a quoted path, by its absolute host path, and from
// an included file in turn), includes files outside .git every way git
// allows, includes itself, and keeps credential stores in .git.
func includeRepo(t *testing.T) (repo, outside string) {
	t.Helper()
	needTools(t, "git", "mksquashfs", "unsquashfs")
	base := t.TempDir()
	repo, outside = filepath.Join(base, "repo"), filepath.Join(base, "outside")
	gitIn(t, base, "init", "-q", "-b", "main", repo)
	write(t, filepath.Join(repo, "a.txt"), "a\n", 0o644)
	gitIn(t, repo, "add", "-A")
	gitIn(t, repo, "commit", "-q", "-m", "includes")
	write(t, filepath.Join(outside, "out.inc"), "[http]\n\textraHeader = "+secretInc+"\n", 0o644)
	git := filepath.Join(repo, ".git")
	cfg, err := os.ReadFile(filepath.Join(git, "config"))
	if err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(git, "config"), string(cfg)+`[Include]
	Path = creds.inc
[includeIf "gitdir:/nowhere/"]
	path = "sub/cond.inc"
[INCLUDE]
	PATH = ~/.gitconfig-secret
	path = ../../outside/out.inc
	path = ../a.txt
	path = link.inc
	path = linkdir/out.inc
	path = %(prefix)/etc/x.inc
	path = `+filepath.Join(git, "abs.inc")+`
	path = `+filepath.Join(outside, "out.inc")+`
[include "sub"]
	path = near.inc
[credential]
	helper = store --file .git/my-store
[credential "https://x.example"]
	helper = "!cat .git/tok;"
[alias]
	st = "status \
--short"
`, 0o644)
	write(t, filepath.Join(git, "creds.inc"), "[http]\n\textraHeader = "+secretInc+"\n[include]\n\tpath = nested/deeper.inc\n", 0o600)
	write(t, filepath.Join(git, "nested/deeper.inc"), "[credential]\n\thelper = "+secretInc+"\n[user]\n\tname = kept\n", 0o644)
	write(t, filepath.Join(git, "self.inc"), "[include]\n\tpath = self.inc\n[alias]\n\tco = checkout\n", 0o644)
	write(t, filepath.Join(git, "sub/cond.inc"), "[url \"https://"+secretInc+"@github.com/\"]\n\tinsteadOf = gh:\n[core]\n\tautocrlf = input\n[include]\n\tpath = ../self.inc\n", 0o644)
	write(t, filepath.Join(git, "abs.inc"), "[sendemail]\n\tsmtpPass = "+secretInc+"\n[color]\n\tui = auto\n", 0o644)
	write(t, filepath.Join(git, "near.inc"), "[x]\n\ty = z\n", 0o644)
	for _, store := range []string{"credentials", ".git-credentials", "my-store"} {
		write(t, filepath.Join(git, store), "https://u:"+secretInc+"@x.example\n", 0o600)
	}
	write(t, filepath.Join(git, "tok"), secretInc+"\n", 0o600)
	symlink(t, filepath.Join(outside, "out.inc"), filepath.Join(git, "link.inc"))
	symlink(t, outside, filepath.Join(git, "linkdir"))
	return repo, outside
}

// TestPackGitIncludes checks a copy holds no included file, no include
// line and no credential store, that what the included files in .git set
// (less credentials) is in the copy's config, and that every removal is
// named.
func TestPackGitIncludes(t *testing.T) {
	t.Parallel()
	repo, _ := includeRepo(t)
	tr := mustPack(t, repo, Options{})
	got := unpack(t, tr.Image)
	err := filepath.WalkDir(got, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		if b, err := os.ReadFile(p); err != nil || strings.Contains(string(b), secretInc) {
			t.Errorf("%s holds the secret (%v)", p, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(snapshot(t, got, false))); tr.Files != n {
		t.Errorf("Files = %d; the copy holds %d", tr.Files, n)
	}
	for _, gone := range []string{"creds.inc", "nested/deeper.inc", "self.inc", "sub/cond.inc", "abs.inc",
		"credentials", ".git-credentials", "my-store", "tok"} {
		if _, err := os.Lstat(filepath.Join(got, ".git", gone)); err == nil {
			t.Errorf(".git/%s is in the copy", gone)
		}
	}
	// Git reads the copy's config, following any include, as the guest's
	// would: what the included files set is there, and no include is.
	list := gitIn(t, got, "config", "--list", "--includes", "--show-origin")
	for _, want := range []string{"user.name=kept", "alias.co=checkout", "core.autocrlf=input", "color.ui=auto",
		"url.https://github.com/.insteadof=gh:", "alias.st=status --short"} {
		if !strings.Contains(list, want+"\n") {
			t.Errorf("the copy's config lacks %q:\n%s", want, list)
		}
	}
	for _, bad := range []string{secretInc, "include", "credential", "extraheader", "smtppass", "x.y=z"} {
		if strings.Contains(strings.ToLower(list), strings.ToLower(bad)) {
			t.Errorf("the copy's config holds %q:\n%s", bad, list)
		}
	}
	if strings.Count(list, "file:.git/config\t") != strings.Count(list, "\n") {
		t.Errorf("the copy's git reads a file other than .git/config:\n%s", list)
	}
	want := []string{
		"include.path (inlined: .git/creds.inc)",
		".git/creds.inc: include.path (inlined: .git/nested/deeper.inc)",
		"includeif.gitdir:/nowhere/.path (inlined: .git/sub/cond.inc)",
		".git/sub/cond.inc: include.path (inlined: .git/self.inc)",
		".git/self.inc: include.path (an include cycle, dropped)",
		"include.path (outside the git directory, dropped)",
		"include.path (.git/link.inc is not a plain file, dropped)",
		"include.path (.git/linkdir/out.inc is not a plain file, dropped)",
		"include.path (inlined: .git/abs.inc)",
		"include.sub.path (not an include git reads, dropped)",
		".git/creds.inc: http.extraheader",
		".git/nested/deeper.inc: credential.helper",
		".git/sub/cond.inc: url.https://github.com/.insteadof (user info in its name)",
		".git/abs.inc: sendemail.smtppass",
		"credential.helper",
		"credential.https://x.example.helper",
		".git/.git-credentials (a credential store, left out)",
		".git/abs.inc (included, left out)",
		".git/credentials (a credential store, left out)",
		".git/creds.inc (included, left out)",
		".git/my-store (named by credential.helper, left out)",
		".git/nested/deeper.inc (included, left out)",
		".git/self.inc (included, left out)",
		".git/sub/cond.inc (included, left out)",
		".git/tok (named by credential.https://x.example.helper, left out)",
	}
	if !reflect.DeepEqual(tr.CredentialsRemoved, want) {
		t.Errorf("CredentialsRemoved:\n%s\nwant\n%s", strings.Join(tr.CredentialsRemoved, "\n"), strings.Join(want, "\n"))
	}
	for _, r := range tr.CredentialsRemoved {
		for _, v := range []string{secretInc, filepath.Dir(repo), "~", "%(prefix)", "near.inc", "store --file"} {
			if strings.Contains(r, v) {
				t.Errorf("the report quotes a value (%q): %q", v, r)
			}
		}
	}
}

// TestScrubIncludeBounds checks includes nested too deep, too many files
// inlined, and an included file git cannot read: each include past a
// bound is dropped and named, and every file an include names is left
// out.
func TestScrubIncludeBounds(t *testing.T) {
	t.Parallel()
	needTools(t, "git")
	path := stageConfig(t, "[includeIf \"onbranch:nowhere\"]\n\tpath = d1.inc\n[include]\n\tpath = bad.inc\n\tpath = fan.inc\n", 0o644)
	git := filepath.Dir(path)
	for i := 1; i <= 12; i++ {
		write(t, filepath.Join(git, fmt.Sprintf("d%d.inc", i)), fmt.Sprintf("[depth]\n\td%d = yes\n[include]\n\tpath = d%d.inc\n", i, i+1), 0o644)
	}
	write(t, filepath.Join(git, "bad.inc"), "this is [ not a config "+secretInc+"\n", 0o644)
	write(t, filepath.Join(git, "fan.inc"), strings.Repeat("[include]\n\tpath = leaf.inc\n", maxIncludes), 0o644)
	write(t, filepath.Join(git, "leaf.inc"), "[leaf]\n\tx = 1\n", 0o644)
	removed := scrubStaged(t, path)
	for _, want := range []string{
		".git/d9.inc: include.path (inlined: .git/d10.inc)",
		".git/d10.inc: include.path (includes nested over 10 deep, dropped)",
		"include.path (git cannot read .git/bad.inc as a config, dropped)",
		".git/fan.inc: include.path (over 100 included files, dropped)",
		".git/bad.inc (included, left out)",
		".git/d11.inc (included, left out)",
	} {
		if !slices.Contains(removed, want) {
			t.Errorf("the report lacks %q:\n%s", want, strings.Join(removed, "\n"))
		}
	}
	list := gitIn(t, filepath.Dir(git), "config", "--file", path, "--list", "--includes")
	// As git: ten files nested below the config.
	if !strings.Contains(list, "depth.d10=yes\n") || strings.Contains(list, "depth.d11") {
		t.Errorf("want the first ten files of the chain inlined, not the eleventh:\n%s", list)
	}
	// d1 to d10 and fan.inc leave room for 89 leaves.
	if n := strings.Count(list, "leaf.x=1\n"); n != maxIncludes-11 {
		t.Errorf("%d leaves inlined; want %d", n, maxIncludes-11)
	}
	ents, err := os.ReadDir(git)
	if err != nil {
		t.Fatal(err)
	}
	// d12.inc is named only by a file git would not reach.
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".inc") && e.Name() != "d12.inc" {
			t.Errorf(".git/%s is left in the copy", e.Name())
		}
	}
}

func TestShellWords(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"store --file .git/creds", []string{"store", "--file", ".git/creds"}},
		{`store --file="a b"`, []string{"store", "--file=a b"}},
		{`!f() { cat '.git/t k'; }; f`, []string{"!f", "{", "cat", ".git/t k", "}", "f"}},
		{`a\ b "c\"d" 'e\f'`, []string{"a b", `c"d`, `e\f`}},
		{`x|y&&z>w<v`, []string{"x", "y", "z", "w", "v"}},
		{`""`, []string{""}},
		{"", nil},
	}
	for _, tt := range tests {
		if got := shellWords(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("shellWords(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

// TestPackConfigSymlink checks a .git/config that is a symlink: to a file
// of the tree, it becomes a cleaned copy of that file (its relative
// includes read from .git, as git reads them); to a file outside, it is
// left out. Neither is written through.
func TestPackConfigSymlink(t *testing.T) {
	t.Parallel()
	for _, inTree := range []bool{true, false} {
		t.Run(fmt.Sprint("in the tree ", inTree), func(t *testing.T) {
			t.Parallel()
			repo, outside := includeRepo(t)
			git := filepath.Join(repo, ".git")
			target := filepath.Join(outside, "config")
			link := target
			if inTree {
				target, link = filepath.Join(repo, "team.gitconfig"), "../team.gitconfig"
			}
			if err := os.Rename(filepath.Join(git, "config"), target); err != nil {
				t.Fatal(err)
			}
			symlink(t, link, filepath.Join(git, "config"))
			before := snapshot(t, filepath.Dir(repo), false)
			tr := mustPack(t, repo, Options{All: true})
			got := unpack(t, tr.Image)
			fi, err := os.Lstat(filepath.Join(got, ".git/config"))
			switch {
			case !inTree && err == nil:
				t.Errorf(".git/config is in the copy: %v", fi.Mode())
			case inTree && (err != nil || !fi.Mode().IsRegular()):
				t.Errorf(".git/config in the copy: %v, %v; want a regular file", fi, err)
			}
			want := "(a symlink to no file of the copy, left out)"
			if inTree {
				want = "(a symlink to team.gitconfig, replaced by a cleaned copy)"
				list := gitIn(t, got, "config", "--list", "--includes", "--show-origin")
				if !strings.Contains(list, "user.name=kept") || strings.Contains(list, secretInc) || strings.Contains(list, "include") {
					t.Errorf("the copy's config:\n%s", list)
				}
			}
			if !slices.Contains(tr.CredentialsRemoved, want) {
				t.Errorf("CredentialsRemoved lacks %q:\n%s", want, strings.Join(tr.CredentialsRemoved, "\n"))
			}
			if d := diffSnapshots(snapshot(t, filepath.Dir(repo), false), before); d != "" {
				t.Errorf("Pack changed the host:\n%s", d)
			}
		})
	}
}
