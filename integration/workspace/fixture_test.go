package workspace

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"io/fs"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
)

// Secrets the fixture's git config holds, and the content of the host file
// its outside link points at: none may reach the guest or the report.
const (
	secretPass    = "s3cr3t-Pass-7741"
	secretHeader  = "c2VjcmV0LWhlYWRlci04ODE="
	secretOutside = "HOST-ONLY-CONTENT-5150"
)

// credentialNames are the settings the copy must drop, as the report
// names them.
var credentialNames = []string{"credential.helper", "http.https://x.example/.extraheader", "remote.origin.url (user info)"}

// Paths of the fixture git does not see: ignored (by the top-level
// .gitignore, and by a nested one), and a FIFO git never lists.
var (
	ignoredPaths = []string{"debug.log", "build", "build/out.o", "sub/deep/trace.log", "sub/local.cfg"}
	fifoPath     = "fifo"
)

// fixture is a git repository with tracked, untracked, ignored and nested
// ignored files, .git with credentials in its config, a symlink inside the
// tree and one pointing outside it, a FIFO, a binary file, an executable
// and names with a space and a non-ASCII letter.
type fixture struct {
	Dir     string // the repository's top level
	Outside string // the host file the outside link points at
}

// gitEnv runs git apart from the host's and the user's configuration.
func gitEnv() []string {
	env := []string{"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "LC_ALL=C",
		"GIT_AUTHOR_NAME=isopod test", "GIT_AUTHOR_EMAIL=test@isopod.invalid",
		"GIT_COMMITTER_NAME=isopod test", "GIT_COMMITTER_EMAIL=test@isopod.invalid",
		"GIT_AUTHOR_DATE=2024-01-01T00:00:00Z", "GIT_COMMITTER_DATE=2024-01-01T00:00:00Z"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GIT_") && !strings.HasPrefix(kv, "LC_ALL=") {
			env = append(env, kv)
		}
	}
	return env
}

// git runs git in dir and returns its stdout.
func git(t *testing.T, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = gitEnv()
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("git %v in %s: %v\n%s", args, dir, err, errb.Bytes())
	}
	return out.String()
}

func requireHostTools(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"git", "mksquashfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not installed on the host: a workspace needs it", tool)
		}
	}
}

// newFixture makes the repository in a fresh temporary directory.
func newFixture(t *testing.T) *fixture {
	t.Helper()
	requireHostTools(t)
	outsideDir := t.TempDir()
	f := &fixture{Dir: filepath.Join(t.TempDir(), "repo"), Outside: filepath.Join(outsideDir, "secret.txt")}
	write(t, f.Outside, secretOutside+"\n", 0o644)

	rng := rand.New(rand.NewSource(16))
	bin := make([]byte, 4096)
	rng.Read(bin)
	bin[0], bin[1] = 0, 0 // NULs: git takes it for binary
	files := []struct {
		path, data string
		mode       fs.FileMode
	}{
		{".gitignore", "*.log\nbuild/\n", 0o644},
		{"README.md", "the fixture\n", 0o644},
		{"a.txt", "hello\n", 0o644},
		{"edit.txt", "one\ntwo\nthree\n", 0o644},
		{"gone.txt", "to be deleted\n", 0o644},
		{"run.sh", "#!/bin/sh\necho run\n", 0o755},
		{"tool.py", "print('tool')\n", 0o644},
		{"bin.dat", string(bin), 0o644},
		{"sp ace.txt", "a name with a space\n", 0o644},
		{"naïve.txt", "a name that is not ASCII\n", 0o644},
		{"sub/.gitignore", "local.cfg\n", 0o644},
		{"sub/deep/f.txt", "a file that becomes a directory\n", 0o644},
		{"rmdir/x.txt", "x\n", 0o644},
		{"rmdir/y/z.txt", "z\n", 0o644},
		{"olddir/a.txt", "a directory that becomes a file\n", 0o644},
	}
	for _, fl := range files {
		write(t, filepath.Join(f.Dir, fl.path), fl.data, fl.mode)
	}
	symlink(t, "a.txt", filepath.Join(f.Dir, "link-in"))
	symlink(t, "a.txt", filepath.Join(f.Dir, "link-swap"))
	symlink(t, f.Outside, filepath.Join(f.Dir, "link-out"))

	git(t, f.Dir, "init", "-q", "-b", "main")
	git(t, f.Dir, "add", "-A")
	git(t, f.Dir, "commit", "-q", "-m", "fixture")

	// What git does not see: ignored files at the top, in an ignored
	// directory and below a nested .gitignore; a FIFO.
	write(t, filepath.Join(f.Dir, "debug.log"), "ignored\n", 0o644)
	write(t, filepath.Join(f.Dir, "build/out.o"), "ignored directory\n", 0o644)
	write(t, filepath.Join(f.Dir, "sub/deep/trace.log"), "nested, ignored by the top rule\n", 0o644)
	write(t, filepath.Join(f.Dir, "sub/local.cfg"), "ignored by the nested .gitignore\n", 0o644)
	if err := mkfifo(filepath.Join(f.Dir, fifoPath)); err != nil {
		t.Fatal(err)
	}
	// Untracked, not ignored.
	write(t, filepath.Join(f.Dir, "notes.txt"), "untracked\n", 0o644)

	// Credentials.
	git(t, f.Dir, "config", "credential.helper", "store")
	git(t, f.Dir, "config", "http.https://x.example/.extraheader", "AUTHORIZATION: basic "+secretHeader)
	git(t, f.Dir, "remote", "add", "origin", "https://user:"+secretPass+"@x.example/r.git")

	if got := git(t, f.Dir, "status", "--porcelain"); got != "?? notes.txt\n" {
		t.Fatalf("fixture: git status --porcelain: %q", got)
	}
	return f
}

func write(t *testing.T, path, data string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil { // past the umask
		t.Fatal(err)
	}
}

func mkfifo(path string) error { return syscall.Mkfifo(path, 0o644) }

func symlink(t *testing.T, target, path string) {
	t.Helper()
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}

// snapshot describes every entry under dir, .git included: its type and
// full mode, its modification time, and the sha256 of a file's bytes or a
// link's target. Two equal snapshots mean the tree was not written.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		desc := fmt.Sprintf("%v %d", info.Mode(), info.ModTime().UnixNano())
		switch {
		case info.Mode().IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			desc += fmt.Sprintf(" %x", sha256.Sum256(b))
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			desc += " -> " + target
		}
		out[rel] = desc
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// sameSnapshot fails the test with the differences between two snapshots.
func sameSnapshot(t *testing.T, what string, before, after map[string]string) {
	t.Helper()
	var diffs []string
	for p, b := range before {
		if a, ok := after[p]; !ok {
			diffs = append(diffs, "removed "+p)
		} else if a != b {
			diffs = append(diffs, fmt.Sprintf("changed %s: %s => %s", p, b, a))
		}
	}
	for p := range after {
		if _, ok := before[p]; !ok {
			diffs = append(diffs, "added "+p)
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Errorf("%s was written:\n%s", what, strings.Join(diffs, "\n"))
	}
}

// manifestPy prints, sorted, one line per path under its argument outside
// the top-level .git: the path, then d (directory), l and the link's
// target, or f, git's mode (755 when the owner may execute, else 644) and
// the sha256 of the bytes. git carries no other mode and no directory of
// its own, so that is what a patch can make equal. hostManifest is the
// same on the host.
const manifestPy = `
import hashlib, os, stat, sys
root = sys.argv[1]
out = []
for dp, dns, fns in os.walk(root):
    rel = os.path.relpath(dp, root)
    if rel == ".":
        rel = ""
        dns[:] = [d for d in dns if d != ".git"]
    for n in dns + fns:
        p = os.path.join(dp, n)
        r = os.path.join(rel, n) if rel else n
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode):
            out.append(r + "\tl\t" + os.readlink(p))
        elif stat.S_ISDIR(st.st_mode):
            out.append(r + "\td")
        elif stat.S_ISREG(st.st_mode):
            mode = "755" if st.st_mode & 0o100 else "644"
            out.append(r + "\tf" + mode + "\t" + hashlib.sha256(open(p, "rb").read()).hexdigest())
        else:
            out.append(r + "\t?")
sys.stdout.write("".join(l + "\n" for l in sorted(out)))
`

// hostManifest is manifestPy's output for a host directory.
func hostManifest(t *testing.T, root string) string {
	t.Helper()
	var lines []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == root {
			return nil
		}
		rel, _ := filepath.Rel(root, p)
		if rel == ".git" {
			return fs.SkipDir
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch m := info.Mode(); {
		case m&fs.ModeSymlink != 0:
			target, err := os.Readlink(p)
			if err != nil {
				return err
			}
			lines = append(lines, rel+"\tl\t"+target)
		case m.IsDir():
			lines = append(lines, rel+"\td")
		case m.IsRegular():
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			mode := "644"
			if m&0o100 != 0 {
				mode = "755"
			}
			lines = append(lines, fmt.Sprintf("%s\tf%s\t%x", rel, mode, sha256.Sum256(b)))
		default:
			lines = append(lines, rel+"\t?")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// Python sorts str by code point, Go by byte: the same for UTF-8.
	sort.Strings(lines)
	return strings.Join(lines, "\n") + "\n"
}

// pristineCopy copies the fixture as the guest got it in git mode: the
// whole tree less what git does not see (ignored files, the FIFO).
func pristineCopy(t *testing.T, f *fixture, keepIgnored bool) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "pristine")
	if out, err := exec.Command("cp", "-a", f.Dir, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v\n%s", err, out)
	}
	os.Remove(filepath.Join(dst, fifoPath))
	if !keepIgnored {
		for _, p := range ignoredPaths {
			os.RemoveAll(filepath.Join(dst, p))
		}
	}
	return dst
}

// applyPatch applies patch to dir with git apply, after git apply --check.
func applyPatch(t *testing.T, dir, patch string) {
	t.Helper()
	git(t, dir, "apply", "--check", patch)
	git(t, dir, "apply", patch)
}
