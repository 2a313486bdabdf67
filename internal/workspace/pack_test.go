//go:build linux

package workspace

import (
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/errdefs"
)

// TestPackGit checks a copy of a git work tree holds exactly what git
// sees plus .git, with credentials gone, links as links, modes and times
// kept.
func TestPackGit(t *testing.T) {
	t.Parallel()
	repo, outside := fixture(t)
	if err := os.Chmod(filepath.Join(repo, "bin/tool.sh"), 0o755|os.ModeSetuid|os.ModeSetgid); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(repo, ".git/index.lock"), "", 0o644) // a git command running on the host
	// Git never lists a FIFO: the fixture's is counted as skipped, one it
	// ignores is not.
	if err := syscall.Mkfifo(filepath.Join(repo, "ignored.log"), 0o644); err != nil {
		t.Fatal(err)
	}
	before := snapshot(t, repo, false)
	tr := mustPack(t, repo, Options{})
	if !reflect.DeepEqual(tr.Skipped, map[string]int{SkippedGitLock: 1, SkippedFIFO: 1}) {
		t.Errorf("Skipped = %v; want the lock file and the FIFO git does not ignore", tr.Skipped)
	}
	if !tr.Git || tr.Prefix != "" {
		t.Errorf("Git, Prefix = %v, %q; want true, \"\"", tr.Git, tr.Prefix)
	}
	got := unpack(t, tr.Image)
	snap := snapshot(t, got, true)
	want := []string{".gitignore", "README.md", "bin", "bin/tool.sh", "data", "data/blob.bin", "empty",
		"link-in", "link-out", "linkdir-out", "src", "src/main.go", "sub", "sub/.gitignore", "sub/deep",
		"sub/deep/more.txt", "sub/keep.txt", "untracked.txt", "with space", "with space/naïve file.txt"}
	if k := keys(snap); !reflect.DeepEqual(k, want) {
		t.Errorf("copy holds %q;\nwant %q", k, want)
	}
	if _, err := os.Stat(filepath.Join(got, ".git/HEAD")); err != nil {
		t.Errorf(".git was not copied: %v", err)
	}
	for rel, target := range map[string]string{"link-in": "README.md", "link-out": filepath.Join(outside, "secret.txt"), "linkdir-out": outside} {
		if e := snap[rel]; e.Mode.Type() != os.ModeSymlink || e.Data != target {
			t.Errorf("%s: got %v -> %q; want a symlink to %q", rel, e.Mode, e.Data, target)
		}
	}
	checkModesAndTimes(t, repo, got, map[string]os.FileMode{"bin/tool.sh": 0o755, "src/main.go": 0o644, "sub/deep/more.txt": 0o600})
	if tr.Files != int64(len(snap)+countUnder(t, filepath.Join(got, ".git"))+1) {
		t.Errorf("Files = %d; the copy holds %d entries besides .git", tr.Files, len(snap))
	}
	checkNoSecrets(t, got)
	wantRemoved := []string{"http.https://github.com/.extraheader", "credential.helper", "remote.origin.url (user info)"}
	if !reflect.DeepEqual(tr.CredentialsRemoved, wantRemoved) {
		t.Errorf("CredentialsRemoved = %q; want %q", tr.CredentialsRemoved, wantRemoved)
	}
	cfg, _ := os.ReadFile(filepath.Join(got, ".git/config"))
	if !strings.Contains(string(cfg), "https://github.com/o/r.git") {
		t.Errorf("the remote's URL did not survive without its user info:\n%s", cfg)
	}
	// git works in the copy and sees what it saw on the host.
	status := gitIn(t, got, "status", "--porcelain")
	if status != " D deleted.txt\n?? untracked.txt\n" {
		t.Errorf("git status in the copy:\n%s", status)
	}
	if d := diffSnapshots(snapshot(t, repo, false), before); d != "" {
		t.Errorf("Pack changed the host tree:\n%s", d)
	}
}

func countUnder(t *testing.T, dir string) int {
	t.Helper()
	return len(snapshot(t, dir, false))
}

// checkModesAndTimes compares the copy's modes with want and every
// entry's modification time with the host's.
func checkModesAndTimes(t *testing.T, host, got string, want map[string]os.FileMode) {
	t.Helper()
	for rel, mode := range want {
		fi, err := os.Lstat(filepath.Join(got, rel))
		if err != nil || fi.Mode() != mode {
			t.Errorf("%s: mode %v (%v); want %v", rel, fi.Mode(), err, mode)
		}
	}
	for _, rel := range []string{"README.md", "bin", "link-out", "sub/deep/more.txt", "with space"} {
		h, _ := os.Lstat(filepath.Join(host, rel))
		g, _ := os.Lstat(filepath.Join(got, rel))
		if h == nil || g == nil || h.ModTime().Unix() != g.ModTime().Unix() {
			t.Errorf("%s: the copy's time differs from the host's", rel)
		}
	}
}

// checkNoSecrets fails when any file under dir holds a planted secret.
func checkNoSecrets(t *testing.T, dir string) {
	t.Helper()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		b, err := os.ReadFile(p)
		for _, s := range []string{secretToken, secretHeader, secretOut, "/root/.creds"} {
			if strings.Contains(string(b), s) {
				t.Errorf("%s holds %q", p, s)
			}
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestPackModes checks what a copy takes in each mode.
func TestPackModes(t *testing.T) {
	t.Parallel()
	repo, _ := fixture(t)
	plain := t.TempDir()
	write(t, filepath.Join(plain, "a/b.txt"), "b\n", 0o644)
	write(t, filepath.Join(plain, "x.log"), "x\n", 0o644)
	if err := syscall.Mkfifo(filepath.Join(plain, "pipe"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		dir        string
		o          Options
		has, hasnt []string
		git        bool
		prefix     string
		skipped    map[string]int
	}{
		{name: "all", dir: repo, o: Options{All: true},
			has:     []string{"debug.log", "build/out.o", "sub/local.txt", ".git/config", "untracked.txt"},
			hasnt:   []string{"fifo", "deleted.txt"},
			skipped: map[string]int{SkippedFIFO: 1}},
		{name: "subdirectory", dir: filepath.Join(repo, "sub"), git: true, prefix: "sub/",
			has:     []string{"keep.txt", "deep/more.txt", ".gitignore"},
			hasnt:   []string{"local.txt", ".git"},
			skipped: map[string]int{}},
		{name: "outside git", dir: plain,
			has:     []string{"a/b.txt", "x.log"},
			hasnt:   []string{"pipe"},
			skipped: map[string]int{SkippedFIFO: 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := mustPack(t, tt.dir, tt.o)
			got := unpack(t, tr.Image)
			for _, rel := range tt.has {
				if _, err := os.Lstat(filepath.Join(got, rel)); err != nil {
					t.Errorf("%s is missing from the copy", rel)
				}
			}
			for _, rel := range tt.hasnt {
				if _, err := os.Lstat(filepath.Join(got, rel)); err == nil {
					t.Errorf("%s is in the copy", rel)
				}
			}
			if tr.Git != tt.git || tr.Prefix != tt.prefix {
				t.Errorf("Git, Prefix = %v, %q; want %v, %q", tr.Git, tr.Prefix, tt.git, tt.prefix)
			}
			if !reflect.DeepEqual(tr.Skipped, tt.skipped) {
				t.Errorf("Skipped = %v; want %v", tr.Skipped, tt.skipped)
			}
			checkNoSecrets(t, got)
		})
	}
}

// TestPackCaps checks a tree over a cap is refused with the numbers, and
// nothing is left behind.
func TestPackCaps(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for i := range 30 {
		write(t, filepath.Join(dir, "d", string(rune('a'+i%26))+string(rune('0'+i/26))), strings.Repeat("x", 100), 0o644)
	}
	tests := []struct {
		name string
		o    Options
		want []string
	}{
		{"entries", Options{MaxFiles: 10}, []string{"holds 31 entries", "limit of 10"}},
		{"entries, counting stopped", Options{MaxFiles: 2}, []string{"holds more than 20 entries", "limit of 2"}},
		{"bytes", Options{MaxBytes: 1000}, []string{"holds 3000 bytes", "limit of 1000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			f, err := os.Open(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			tr, err := Pack(t.Context(), f, work, tt.o)
			if err == nil {
				tr.Close()
				t.Fatal("Pack accepted a tree over its cap")
			}
			var le *LimitError
			if !errors.As(err, &le) || !errors.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("got %v; want a LimitError that is an invalid argument", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%q does not say %q", err, w)
				}
			}
			if left, _ := os.ReadDir(work); len(left) != 0 {
				t.Errorf("a refused Pack left %d entries in its work directory", len(left))
			}
		})
	}
	if _, err := pack(t, dir, Options{MaxFiles: -1}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a negative cap: got %v; want an invalid argument", err)
	}
}

// TestPackWorkInside checks a work directory inside the tree is not copied
// into itself.
func TestPackWorkInside(t *testing.T) {
	t.Parallel()
	needTools(t, "mksquashfs", "unsquashfs")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.txt"), "a\n", 0o644)
	work := filepath.Join(dir, "work")
	if err := os.Mkdir(work, 0o755); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := Pack(t.Context(), f, work, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	got := keys(snapshot(t, unpack(t, tr.Image), false))
	if want := []string{"a.txt", "work"}; !reflect.DeepEqual(got, want) {
		t.Errorf("copy holds %q; want %q", got, want)
	}
}

// TestClose checks Close removes everything and may be called again.
func TestClose(t *testing.T) {
	t.Parallel()
	needTools(t, "mksquashfs")
	dir := t.TempDir()
	write(t, filepath.Join(dir, "ro/f"), "f", 0o444)
	if err := os.Chmod(filepath.Join(dir, "ro"), 0o555); err != nil {
		t.Fatal(err)
	}
	tr := mustPack(t, dir, Options{})
	priv := filepath.Dir(tr.Image)
	for range 2 {
		if err := tr.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(priv); !os.IsNotExist(err) {
		t.Errorf("%s survived Close: %v", priv, err)
	}
	if _, err := tr.Patch(t.Context(), nil, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Patch after Close: got %v; want a failed precondition", err)
	}
}

// TestPackNested checks a submodule and an untracked nested repository are
// copied by their own rules, with their configs scrubbed, and that a linked
// worktree's .git file is copied as the file it is.
func TestPackNested(t *testing.T) {
	t.Parallel()
	needTools(t, "git", "mksquashfs", "unsquashfs")
	base := t.TempDir()
	lib, repo := filepath.Join(base, "lib"), filepath.Join(base, "repo")
	gitIn(t, base, "init", "-q", "-b", "main", lib)
	write(t, filepath.Join(lib, "lib.c"), "int x;\n", 0o644)
	write(t, filepath.Join(lib, ".gitignore"), "*.o\n", 0o644)
	gitIn(t, lib, "add", "-A")
	gitIn(t, lib, "commit", "-q", "-m", "lib")
	gitIn(t, base, "init", "-q", "-b", "main", repo)
	write(t, filepath.Join(repo, "top.txt"), "top\n", 0o644)
	gitIn(t, repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", lib, "lib")
	gitIn(t, repo, "commit", "-q", "-m", "top")
	gitIn(t, filepath.Join(repo, "lib"), "remote", "set-url", "origin", "https://u:"+secretToken+"@example.com/lib.git")
	write(t, filepath.Join(repo, "lib/lib.o"), "ignored by the submodule\n", 0o644)
	gitIn(t, repo, "init", "-q", "nested")
	write(t, filepath.Join(repo, "nested/.gitignore"), "*.tmp\n", 0o644)
	write(t, filepath.Join(repo, "nested/n.txt"), "n\n", 0o644)
	write(t, filepath.Join(repo, "nested/x.tmp"), "ignored by nested\n", 0o644)
	gitIn(t, filepath.Join(repo, "nested"), "config", "credential.helper", "cache")

	tr := mustPack(t, repo, Options{})
	got := unpack(t, tr.Image)
	for _, rel := range []string{"lib/lib.c", "lib/.git", ".git/modules/lib/HEAD", "nested/n.txt", "nested/.git/HEAD"} {
		if _, err := os.Lstat(filepath.Join(got, rel)); err != nil {
			t.Errorf("%s is missing from the copy", rel)
		}
	}
	for _, rel := range []string{"lib/lib.o", "nested/x.tmp"} {
		if _, err := os.Lstat(filepath.Join(got, rel)); err == nil {
			t.Errorf("%s, ignored by its own repository, is in the copy", rel)
		}
	}
	want := []string{".git/modules/lib/config: remote.origin.url (user info)", "nested/.git/config: credential.helper"}
	if !reflect.DeepEqual(tr.CredentialsRemoved, want) {
		t.Errorf("CredentialsRemoved = %q; want %q", tr.CredentialsRemoved, want)
	}
	checkNoSecrets(t, got)
	if s := gitIn(t, filepath.Join(got, "lib"), "status", "--porcelain"); s != "" {
		t.Errorf("git status in the copied submodule:\n%s", s)
	}

	wt := filepath.Join(base, "wt")
	gitIn(t, repo, "worktree", "add", "-q", wt)
	tr = mustPack(t, wt, Options{})
	got = unpack(t, tr.Image)
	if fi, err := os.Lstat(filepath.Join(got, ".git")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("a worktree's .git: got %v, %v; want the file copied as it is", fi, err)
	}
}

// TestPackUnreadableRepo checks a repository git refuses to read is an
// error, not a tree taken whole (which would bring in ignored files).
func TestPackUnreadableRepo(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("needs root to give the repository to another user")
	}
	repo, _ := fixture(t)
	if err := filepath.WalkDir(repo, func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 54321, 54321)
	}); err != nil {
		t.Fatal(err)
	}
	_, err := pack(t, repo, Options{})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "dubious ownership") {
		t.Errorf("got %v; want a failed precondition quoting git", err)
	}
}

// TestPackWithoutGit checks what happens on a host without git: a tree in
// a repository is refused unless taken whole, and then its git configs are
// removed whole.
func TestPackWithoutGit(t *testing.T) {
	repo, _ := fixture(t)
	plain := t.TempDir()
	write(t, filepath.Join(plain, "a"), "a\n", 0o644)
	bin := t.TempDir()
	for _, tool := range []string{"mksquashfs", "unsquashfs"} {
		p, _ := exec.LookPath(tool)
		symlink(t, p, filepath.Join(bin, tool))
	}
	t.Setenv("PATH", bin)
	write(t, filepath.Join(repo, ".git/credentials"), "https://u:"+secretToken+"@github.com\n", 0o600)

	if _, err := pack(t, repo, Options{}); !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "git is not installed") {
		t.Errorf("a repository without git: got %v; want a failed precondition", err)
	}
	if _, err := pack(t, filepath.Join(repo, "sub/deep"), Options{}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a directory deep in a repository without git: got %v; want a failed precondition", err)
	}
	tr := mustPack(t, repo, Options{All: true})
	if want := []string{"(the whole file: git is not installed to read it)", ".git/credentials (a credential store, left out)"}; !reflect.DeepEqual(tr.CredentialsRemoved, want) {
		t.Errorf("CredentialsRemoved = %q; want %q", tr.CredentialsRemoved, want)
	}
	got := unpack(t, tr.Image)
	if _, err := os.Lstat(filepath.Join(got, ".git/config")); err == nil {
		t.Error(".git/config is in the copy")
	}
	checkNoSecrets(t, got)
	tr = mustPack(t, plain, Options{})
	if _, err := tr.Patch(t.Context(), []Change{{Path: "a", Kind: Deleted}}, nil); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Patch without git: got %v; want a failed precondition", err)
	}
}

// TestPackKeepsHoles checks sparse files stay sparse in the copy, holding
// the same bytes there and in the image.
func TestPackKeepsHoles(t *testing.T) {
	t.Parallel()
	needTools(t, "mksquashfs", "unsquashfs")
	dir := t.TempDir()
	p := filepath.Join(dir, "sparse.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	const size = 64 << 20
	data := strings.Repeat("data", 1024)
	for _, off := range []int64{0, 8 << 20, size - 4096} {
		if _, err := f.WriteAt([]byte(data), off); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	write(t, filepath.Join(dir, "trailing-hole"), data, 0o644)
	if err := os.Truncate(filepath.Join(dir, "trailing-hole"), 1<<20); err != nil {
		t.Fatal(err)
	}
	if allocated(t, p) > 1<<20 {
		t.Skip("the test directory's filesystem keeps no holes")
	}
	tr := mustPack(t, dir, Options{All: true})
	if tr.Bytes != size+1<<20 {
		t.Errorf("Bytes = %d; want the files' sizes, %d", tr.Bytes, size+1<<20)
	}
	for _, name := range []string{"sparse.img", "trailing-hole"} {
		staged := filepath.Join(tr.dir, "tree", name)
		if a := allocated(t, staged); a > 1<<20 {
			t.Errorf("the copy of %s takes %d bytes; want its holes kept", name, a)
		}
		if got, want := sum(t, staged), sum(t, filepath.Join(dir, name)); got != want {
			t.Errorf("the copy of %s differs from the original", name)
		}
	}
	got := filepath.Join(unpack(t, tr.Image), "sparse.img")
	if fi, err := os.Stat(got); err != nil || fi.Size() != size || sum(t, got) != sum(t, p) {
		t.Errorf("sparse.img in the image: %v, %v; want the original's bytes", fi, err)
	}
}

// allocated is the space a file takes on disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func sum(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%x", sha256.Sum256(b))
}
