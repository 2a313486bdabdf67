//go:build linux

package workspace

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
)

// repoInfo is what git says of a directory.
type repoInfo struct {
	inWorkTree   bool
	prefix       string // below the top level, with a trailing slash; "" at the top
	objectFormat string // "sha1", "sha256"
}

// gitPath finds the host's git; "" when there is none.
func gitPath() string {
	p, err := hosttool.Find("git")
	if err != nil {
		return ""
	}
	return p
}

// gitEnv is the environment git runs in: the caller's, less every GIT_*
// variable (GIT_DIR and its kin would point git elsewhere), in the C locale,
// never prompting. extra is added last.
func gitEnv(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "GIT_") || k == "LC_ALL" || k == "LANG" || k == "LANGUAGE" {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "LC_ALL=C", "GIT_TERMINAL_PROMPT=0", "GIT_OPTIONAL_LOCKS=0")
	return append(env, extra...)
}

// runGit runs git in the directory open as fd (through /proc/self/fd, so no
// path is resolved again) and returns its stdout. The repository's
// fsmonitor, a command it may name, is never run.
func runGit(ctx context.Context, git string, fd int, args ...string) ([]byte, error) {
	return runGitIn(ctx, git, fd, nil, args...)
}

// runGitIn is runGit with stdin.
func runGitIn(ctx context.Context, git string, fd int, stdin []byte, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, git, append([]string{"-c", "core.fsmonitor=false"}, args...)...)
	cmd.Dir = "/proc/self/fd/" + strconv.Itoa(fd)
	cmd.Env = gitEnv()
	cmd.WaitDelay = 5 * time.Second
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, &gitError{args: args, err: err, stderr: strings.TrimSpace(stderr.String())}
	}
	return out.Bytes(), nil
}

// gitError is a failed git command, with what it said.
type gitError struct {
	args   []string
	err    error
	stderr string
}

func (e *gitError) Error() string {
	msg := e.stderr
	if len(msg) > 2000 {
		msg = msg[:2000] + "..."
	}
	return fmt.Sprintf("git %s: %v: %s", strings.Join(e.args, " "), e.err, msg)
}

func (e *gitError) Unwrap() error { return e.err }

// revParse asks git whether the directory open as fd lies in a work tree.
// Outside any repository it answers the zero repoInfo; a repository git
// refuses to read (one owned by another user, a broken config) is an error,
// so that ignored files are never taken by mistake.
func revParse(ctx context.Context, git string, fd int) (repoInfo, error) {
	out, err := runGit(ctx, git, fd, "rev-parse", "--is-inside-work-tree", "--show-prefix", "--show-object-format")
	if err != nil {
		var ge *gitError
		if errors.As(err, &ge) && strings.Contains(ge.stderr, "not a git repository") {
			return repoInfo{}, nil
		}
		if ctx.Err() != nil {
			return repoInfo{}, ctx.Err()
		}
		return repoInfo{}, fmt.Errorf("the workspace lies in a git repository git cannot read (%w); fix that, or take the whole tree: %w",
			err, errdefs.ErrFailedPrecondition)
	}
	lines := strings.Split(string(out), "\n")
	if len(lines) < 3 {
		return repoInfo{}, fmt.Errorf("git rev-parse answered %q", out)
	}
	return repoInfo{inWorkTree: lines[0] == "true", prefix: lines[1], objectFormat: lines[2]}, nil
}

// listRepo chooses, by git's rules, what to copy of the directory open as
// fd: tracked files and untracked ones that are not ignored, and .git when
// the directory is its repository's top level. It returns nil outside a
// work tree.
func listRepo(ctx context.Context, git string, fd int) (*sel, repoInfo, error) {
	info, err := revParse(ctx, git, fd)
	if err != nil || !info.inWorkTree {
		return nil, info, err
	}
	out, err := runGit(ctx, git, fd, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return nil, info, fmt.Errorf("listing the workspace's files: %w", err)
	}
	s := &sel{kids: map[string]*sel{}}
	for _, name := range bytes.Split(out, []byte{0}) {
		if len(name) > 0 {
			s.add(string(name))
		}
	}
	if info.prefix == "" {
		s.kids[".git"] = allSel
	}
	return s, info, nil
}

// nestedLister lists a directory git named itself: a submodule or an
// untracked nested repository, by its own rules. A directory that is not
// the top of a repository of its own (a submodule not checked out) yields
// nothing below it.
func nestedLister(git string) func(ctx context.Context, fd int) (*sel, error) {
	return func(ctx context.Context, fd int) (*sel, error) {
		s, info, err := listRepo(ctx, git, fd)
		if err != nil {
			return nil, err
		}
		if s == nil || info.prefix != "" {
			return &sel{}, nil
		}
		return s, nil
	}
}

// checkIgnored asks git which of paths (relative to the directory open as
// fd) its rules ignore. The index is not consulted (--no-index): the paths
// asked about are absent from the copy, so not tracked files git could see,
// and a path in a submodule would make git refuse the whole question. A
// path below a symlink of the tree (a directory the guest made where a link
// was) is not asked about, since git refuses the whole question for it, and
// counts as not ignored: the host holds no file there for it to clash with.
func checkIgnored(ctx context.Context, git string, fd int, paths []string) (map[string]bool, error) {
	paths = notBeyondLinks(fd, paths)
	if len(paths) == 0 {
		return nil, nil
	}
	in := []byte(strings.Join(paths, "\x00") + "\x00")
	out, err := runGitIn(ctx, git, fd, in, "check-ignore", "--no-index", "-z", "--stdin")
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 1 {
		return nil, nil // none is ignored
	}
	if err != nil {
		return nil, fmt.Errorf("asking git which added files it ignores: %w", err)
	}
	ignored := map[string]bool{}
	for _, p := range strings.Split(string(out), "\x00") {
		if p != "" {
			ignored[p] = true
		}
	}
	return ignored, nil
}

// notBeyondLinks returns the paths none of whose directories is a symlink
// in the tree open as fd.
func notBeyondLinks(fd int, paths []string) []string {
	link := map[string]bool{} // by directory, whether it is a symlink
	beyond := func(p string) bool {
		for i := 0; i < len(p); i++ {
			if p[i] != '/' {
				continue
			}
			dir := p[:i]
			l, ok := link[dir]
			if !ok {
				st, err := lstatBeneath(fd, dir)
				l = err == nil && st.Mode&unix.S_IFMT == unix.S_IFLNK
				link[dir] = l
			}
			if l {
				return true
			}
		}
		return false
	}
	kept := paths[:0:0]
	for _, p := range paths {
		if !beyond(p) {
			kept = append(kept, p)
		}
	}
	return kept
}

// gitAbove reports whether the directory open as fd, or one above it,
// holds a .git entry; it is asked only when the host has no git.
func gitAbove(fd int) (bool, error) {
	cur, err := unix.Openat(fd, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return false, err
	}
	for {
		var st, parent unix.Stat_t
		if err := unix.Fstatat(cur, ".git", &st, unix.AT_SYMLINK_NOFOLLOW); err == nil {
			unix.Close(cur)
			return true, nil
		}
		up, err := unix.Openat(cur, "..", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			unix.Close(cur)
			return false, err
		}
		_ = unix.Fstat(cur, &st)
		_ = unix.Fstat(up, &parent)
		unix.Close(cur)
		if st.Dev == parent.Dev && st.Ino == parent.Ino {
			unix.Close(up)
			return false, nil // the root
		}
		cur = up
	}
}
