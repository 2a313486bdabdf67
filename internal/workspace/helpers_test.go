//go:build linux

package workspace

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// Credentials planted in the fixture's .git/config; none may reach a copy.
const (
	secretToken  = "ghp_s3cr3tT0ken"
	secretHeader = "AUTHORIZATION: basic c2VjcmV0"
	secretOut    = "OUTSIDE-SECRET"
)

func needTools(t testing.TB, tools ...string) {
	t.Helper()
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed", tool)
		}
	}
}

// gitIn runs git in dir with the host's configuration shut out.
func gitIn(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitEnv("GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@t", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@t")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("git %s in %s: %v\n%s", strings.Join(args, " "), dir, err, out)
	}
	return string(out)
}

func write(t testing.TB, path, body string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(body), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t testing.TB, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// binaryBody is content git takes as binary.
var binaryBody = string([]byte{0x7f, 'E', 'L', 'F', 0, 0, 1, 2, 0xff, 0xfe, 0, '\n', 3})

// fixture makes a git repository with tracked, untracked, ignored and
// nested-ignored files, links inside and out, a FIFO, a binary file, an
// executable and credentials in .git/config, next to an outside directory
// holding a secret. It returns the repository and the outside directory.
func fixture(t testing.TB) (repo, outside string) {
	t.Helper()
	needTools(t, "git", "mksquashfs", "unsquashfs")
	base := t.TempDir()
	repo, outside = filepath.Join(base, "repo"), filepath.Join(base, "outside")
	write(t, filepath.Join(outside, "secret.txt"), secretOut+"\n", 0o644)
	gitIn(t, base, "init", "-q", "-b", "main", repo)
	write(t, filepath.Join(repo, "README.md"), "# fixture\nline two\n", 0o644)
	write(t, filepath.Join(repo, "src/main.go"), "package main\n\nfunc main() {}\n", 0o644)
	write(t, filepath.Join(repo, "bin/tool.sh"), "#!/bin/sh\necho tool\n", 0o755)
	write(t, filepath.Join(repo, "data/blob.bin"), binaryBody, 0o644)
	write(t, filepath.Join(repo, "with space/naïve file.txt"), "accents\n", 0o644)
	write(t, filepath.Join(repo, "empty"), "", 0o644)
	write(t, filepath.Join(repo, ".gitignore"), "*.log\nbuild/\n", 0o644)
	write(t, filepath.Join(repo, "sub/.gitignore"), "local.txt\n", 0o644)
	write(t, filepath.Join(repo, "sub/keep.txt"), "keep\n", 0o644)
	write(t, filepath.Join(repo, "sub/deep/more.txt"), "more\n", 0o600)
	write(t, filepath.Join(repo, "deleted.txt"), "tracked, then removed from the work tree\n", 0o644)
	symlink(t, "README.md", filepath.Join(repo, "link-in"))
	symlink(t, filepath.Join(outside, "secret.txt"), filepath.Join(repo, "link-out"))
	symlink(t, outside, filepath.Join(repo, "linkdir-out"))
	gitIn(t, repo, "add", "-A")
	gitIn(t, repo, "commit", "-q", "-m", "fixture")
	if err := os.Remove(filepath.Join(repo, "deleted.txt")); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(repo, "untracked.txt"), "untracked\n", 0o644)
	write(t, filepath.Join(repo, "debug.log"), "ignored\n", 0o644)
	write(t, filepath.Join(repo, "build/out.o"), "ignored dir\n", 0o644)
	write(t, filepath.Join(repo, "sub/local.txt"), "nested ignore\n", 0o644)
	if err := syscall.Mkfifo(filepath.Join(repo, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	gitIn(t, repo, "config", "http.https://github.com/.extraheader", secretHeader)
	gitIn(t, repo, "config", "credential.helper", "store --file /root/.creds")
	gitIn(t, repo, "remote", "add", "origin", "https://x-access-token:"+secretToken+"@github.com/o/r.git")
	return repo, outside
}

// entry is one entry of a tree as the tests compare it.
type entry struct {
	Mode os.FileMode
	Data string // content hash, or a link's target
}

// snapshot reads every entry under dir without following links. skipGit
// leaves out .git.
func snapshot(t testing.TB, dir string, skipGit bool) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil
		}
		if skipGit && (rel == ".git" || strings.HasPrefix(rel, ".git/")) {
			return filepath.SkipDir
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		e := entry{Mode: fi.Mode()}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			e.Data, err = os.Readlink(p)
		case fi.Mode().IsRegular():
			var b []byte
			b, err = os.ReadFile(p)
			sum := sha256.Sum256(b)
			e.Data = hex.EncodeToString(sum[:])
		}
		out[rel] = e
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// unpack extracts a squashfs image to a new directory.
func unpack(t testing.TB, image string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "x")
	out, err := exec.Command("unsquashfs", "-no-progress", "-no-xattrs", "-d", dir, image).CombinedOutput()
	if err != nil {
		t.Fatalf("unsquashfs: %v\n%s", err, out)
	}
	return dir
}

// pack packs dir with o, closing the Tree at the test's end.
func pack(t testing.TB, dir string, o Options) (*Tree, error) {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := Pack(context.Background(), f, t.TempDir(), o)
	if tr != nil {
		t.Cleanup(func() { tr.Close() })
	}
	return tr, err
}

// mustPack is pack that fails the test on an error.
func mustPack(t testing.TB, dir string, o Options) *Tree {
	t.Helper()
	tr, err := pack(t, dir, o)
	if err != nil {
		t.Fatalf("Pack(%s): %v", dir, err)
	}
	return tr
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// diffSnapshots describes how got differs from want, "" when it does not.
func diffSnapshots(got, want map[string]entry) string {
	var b bytes.Buffer
	for _, k := range keys(want) {
		g, ok := got[k]
		switch {
		case !ok:
			b.WriteString("missing " + k + "\n")
		case g != want[k]:
			b.WriteString("differs " + k + ": got " + g.Mode.String() + " " + g.Data + "; want " + want[k].Mode.String() + " " + want[k].Data + "\n")
		}
	}
	for _, k := range keys(got) {
		if _, ok := want[k]; !ok {
			b.WriteString("unexpected " + k + "\n")
		}
	}
	return b.String()
}
