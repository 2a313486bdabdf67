//go:build linux

package workspace

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// Patch writes to w a patch of changes, against the tree as it was copied,
// that `git apply` accepts on the original tree: added, modified and
// deleted files, mode changes (the execute bit), symlinks, and binary files
// in git's binary form. Its names carry [Tree.Prefix]. Changes under .git
// are left out, and so, when the copy followed git's rules, are files the
// run added that the repository ignores (as it stands when Patch runs):
// build outputs do not belong in a patch, and one the host already holds
// would make git apply refuse it all. A patch carries no empty directory.
// Nothing reaches w unless the whole patch is made and within the cap.
//
// The patch is made by the host's git in a throwaway repository under the
// Tree's private directory, holding only the original versions of the
// changed paths and their new versions, so it never carries content the
// guest did not change.
func (t *Tree) Patch(ctx context.Context, changes []Change, w io.Writer) (PatchStats, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.dir == "" {
		return PatchStats{}, fmt.Errorf("workspace copy is closed: %w", errdefs.ErrFailedPrecondition)
	}
	root, err := unix.Open(t.stage(), unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return PatchStats{}, fmt.Errorf("opening the workspace copy: %w", err)
	}
	defer unix.Close(root)
	git := gitPath()
	if git == "" {
		return PatchStats{}, fmt.Errorf("making the workspace patch needs git, which is not installed: %w", errdefs.ErrFailedPrecondition)
	}
	var ignored ignoreFunc
	if t.src != nil {
		ignored = func(paths []string) (map[string]bool, error) {
			return checkIgnored(ctx, git, int(t.src.Fd()), paths)
		}
	}
	p, err := makePlan(root, changes, ignored)
	if err != nil {
		return PatchStats{}, err
	}
	stats := PatchStats{LeftOut: p.leftOut, Ignored: p.ignored}
	for _, pt := range p.puts {
		if pt.mode.Type() == fs.ModeSymlink && linkLeaves(t.Prefix, pt.rel, pt.target) {
			stats.LinksOut = append(stats.LinksOut, pt.rel)
		}
	}
	if len(p.dels) == 0 && len(p.puts) == 0 {
		return stats, nil
	}
	if p.content > t.maxPatch {
		return stats, &LimitError{What: "changed bytes", Have: p.content, Limit: t.maxPatch}
	}
	if err := t.writePatch(ctx, git, root, p, &stats, w); err != nil {
		return stats, err
	}
	return stats, nil
}

// writePatch makes the patch of plan p in a throwaway repository and, when
// it is within the cap, copies it to w, counting into stats.
func (t *Tree) writePatch(ctx context.Context, git string, root int, p *plan, stats *PatchStats, w io.Writer) error {
	tmp, err := os.MkdirTemp(t.dir, "patch-")
	if err != nil {
		return fmt.Errorf("making the workspace patch: %w", err)
	}
	defer os.RemoveAll(tmp)
	r := &patchRepo{git: git, dir: tmp, env: gitEnv("GIT_DIR="+filepath.Join(tmp, "repo.git"),
		"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null", "HOME="+tmp, "XDG_CONFIG_HOME="+tmp)}
	init := []string{"init", "--quiet", "--bare"}
	if t.objectFormat != "" {
		init = append(init, "--object-format="+t.objectFormat)
	}
	if _, err := r.run(ctx, nil, nil, init...); err != nil {
		return err
	}
	if err := r.load(ctx, root, p, t.maxPatch); err != nil {
		return err
	}
	if err := r.count(ctx, stats); err != nil {
		return err
	}
	f, err := os.Create(filepath.Join(tmp, "patch"))
	if err != nil {
		return fmt.Errorf("making the workspace patch: %w", err)
	}
	defer f.Close()
	cw := &capWriter{w: f, max: t.maxPatch}
	_, err = r.run(ctx, nil, cw, "diff-tree", "-r", "-p", "--binary", "--full-index", "--no-renames",
		"--no-textconv", "--no-ext-diff", "--no-color", "--src-prefix=a/"+t.Prefix, "--dst-prefix=b/"+t.Prefix,
		"refs/heads/orig^{tree}", "refs/heads/new^{tree}")
	if cw.over {
		return &LimitError{What: "patch bytes", Have: cw.n, AtLeast: true, Limit: t.maxPatch}
	}
	if err != nil {
		return err
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return err
	}
	n, err := io.Copy(w, f)
	stats.Bytes = n
	if err != nil {
		return fmt.Errorf("writing the workspace patch: %w", err)
	}
	return nil
}

// patchRepo is the throwaway repository a patch is made in, with git's
// configuration and attributes of the host shut out.
type patchRepo struct {
	git, dir string
	env      []string
}

func (r *patchRepo) run(ctx context.Context, stdin io.Reader, stdout io.Writer, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, r.git, args...)
	cmd.Dir, cmd.Env, cmd.Stdin = r.dir, r.env, stdin
	cmd.WaitDelay = 5 * time.Second
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("making the workspace patch: %w", &gitError{args: args[:1], err: err, stderr: strings.TrimSpace(stderr.String())})
	}
	return out.Bytes(), nil
}

// errFastImportEnded is what the stream's writer gets once fast-import has
// exited: the writer's own failure, if any, came before.
var errFastImportEnded = errors.New("fast-import ended")

// load imports two commits with fast-import: refs/heads/orig holds the
// original entries the plan touches, refs/heads/new the tree after the
// changes.
func (r *patchRepo) load(ctx context.Context, root int, p *plan, max int64) error {
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		bw := bufio.NewWriterSize(pw, 1<<16)
		err := writeStream(bw, root, p, max)
		if err == nil {
			err = bw.Flush()
		}
		pw.CloseWithError(err)
		errc <- err
	}()
	// The repository lives for one patch: its objects are stored
	// uncompressed (the patch's binary hunks are still deflated).
	_, err := r.run(ctx, pr, nil, "-c", "pack.compression=0", "-c", "core.compression=0", "fast-import", "--quiet", "--done")
	pr.CloseWithError(errFastImportEnded)
	if werr := <-errc; werr != nil && !errors.Is(werr, errFastImportEnded) {
		return werr
	}
	return err
}

// writeStream writes the fast-import stream for the plan.
func writeStream(w *bufio.Writer, root int, p *plan, max int64) error {
	fmt.Fprint(w, "feature done\n")
	commit(w, "orig", "")
	for _, e := range p.orig {
		if err := origBlob(w, root, e); err != nil {
			return err
		}
	}
	commit(w, "new", "from refs/heads/orig\n")
	for _, q := range p.dels {
		fmt.Fprintf(w, "D %s\n", quotePath(q))
	}
	var content int64
	for _, pt := range p.puts {
		if pt.mode.Type() == fs.ModeSymlink {
			fmt.Fprintf(w, "M 120000 inline %s\ndata %d\n%s\n", quotePath(pt.rel), len(pt.target), pt.target)
			continue
		}
		n, err := newBlob(w, pt, max-content)
		if err != nil {
			return err
		}
		content += n
	}
	_, err := fmt.Fprint(w, "done\n")
	return err
}

func commit(w *bufio.Writer, ref, from string) {
	fmt.Fprintf(w, "commit refs/heads/%s\ncommitter isopod <isopod@localhost> 0 +0000\ndata 0\n%s", ref, from)
}

// fileMode is git's mode for a regular file: executable or not.
func fileMode(perm uint32) string {
	if perm&0o100 != 0 {
		return "100755"
	}
	return "100644"
}

func origBlob(w *bufio.Writer, root int, e origEntry) error {
	if e.mode&unix.S_IFMT == unix.S_IFLNK {
		target, err := readlinkBeneath(root, e.rel)
		if err != nil {
			return fmt.Errorf("reading the copy of %s: %w", e.rel, err)
		}
		fmt.Fprintf(w, "M 120000 inline %s\ndata %d\n%s\n", quotePath(e.rel), len(target), target)
		return nil
	}
	f, err := openBeneath(root, e.rel, 0)
	if err != nil {
		return fmt.Errorf("reading the copy of %s: %w", e.rel, err)
	}
	defer f.Close()
	return blob(w, f, e.rel, fileMode(e.mode), -1)
}

// newBlob writes a regular file's new content, at most max bytes, and
// returns its size.
func newBlob(w *bufio.Writer, pt put, max int64) (int64, error) {
	fd, err := unix.Open(pt.content, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, fmt.Errorf("reading the new content of %s: %w", pt.rel, err)
	}
	f := os.NewFile(uintptr(fd), pt.content)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	return fi.Size(), blob(w, f, pt.rel, fileMode(uint32(pt.mode.Perm())), max)
}

// blob writes one regular file of a commit, inline; over max (when not
// negative) it is refused.
func blob(w *bufio.Writer, f *os.File, rel, mode string, max int64) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file: %w", f.Name(), errdefs.ErrInvalidArgument)
	}
	if max >= 0 && fi.Size() > max {
		return &LimitError{What: "changed bytes", Have: fi.Size(), AtLeast: true, Limit: max}
	}
	fmt.Fprintf(w, "M %s inline %s\ndata %d\n", mode, quotePath(rel), fi.Size())
	if _, err := io.CopyN(w, f, fi.Size()); err != nil {
		return fmt.Errorf("reading %s: %w", f.Name(), err)
	}
	return w.WriteByte('\n')
}

// quotePath quotes a path the way fast-import reads it: C-style, control
// bytes in octal, other bytes as they are.
func quotePath(p string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(p); i++ {
		switch c := p[i]; {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c == 0x7f:
			fmt.Fprintf(&b, "\\%03o", c)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// count fills the stats from the raw difference of the two commits.
func (r *patchRepo) count(ctx context.Context, s *PatchStats) error {
	out, err := r.run(ctx, nil, nil, "diff-tree", "-r", "-z", "--raw", "--no-renames", "refs/heads/orig", "refs/heads/new")
	if err != nil {
		return err
	}
	fields := strings.Split(string(out), "\x00")
	for i := 0; i+1 < len(fields); i += 2 {
		meta := fields[i]
		switch meta[len(meta)-1:] {
		case "A":
			s.Added++
		case "D":
			s.Deleted++
		default:
			s.Modified++
		}
	}
	return nil
}

// capWriter passes writes on until max bytes, then refuses them.
type capWriter struct {
	w    io.Writer
	n    int64
	max  int64
	over bool
}

func (c *capWriter) Write(b []byte) (int, error) {
	c.n += int64(len(b))
	if c.n > c.max {
		c.over = true
		return 0, errors.New("over the patch cap")
	}
	return c.w.Write(b)
}
