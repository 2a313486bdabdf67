//go:build linux

package workspace

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// sel chooses what to copy of one directory.
type sel struct {
	all  bool            // every entry, recursively
	leaf bool            // the entry itself was named (git listed it)
	kids map[string]*sel // the named entries below it (when !all)
}

// allSel takes everything.
var allSel = &sel{all: true}

// add names p (slash-separated, relative) and the directories above it. A
// trailing slash (git's name for a nested repository) is dropped.
func (s *sel) add(p string) {
	p = strings.TrimSuffix(p, "/")
	for p != "" {
		name, rest, _ := strings.Cut(p, "/")
		if s.kids == nil {
			s.kids = map[string]*sel{}
		}
		k := s.kids[name]
		if k == nil {
			k = &sel{}
			s.kids[name] = k
		}
		s, p = k, rest
	}
	s.leaf = true
}

// child is the selection for entry name, nil when it is not chosen.
func (s *sel) child(name string) *sel {
	if s.all {
		return allSel
	}
	return s.kids[name]
}

// errChanged says an entry changed type between its stat and its open.
var errChanged = errors.New("changed while being copied")

// ErrKeptChanging is an entry that changed again when its copy was
// retried: the tree is being written to.
var ErrKeptChanging = errors.New("kept changing while being copied")

// errStop ends a walk that is over a cap and has counted enough.
var errStop = errors.New("counted enough")

// testHookBeforeOpenDir, when set, runs before each directory below the root
// is opened (tests swap it for a symlink there).
var testHookBeforeOpenDir func(rel string)

// walker copies a tree from source descriptors into the staging copy,
// counting as it goes. Once a cap is passed it stops writing and only
// counts, up to ten times the entry cap, so the refusal can say how much
// there is.
type walker struct {
	ctx                context.Context
	maxFiles, maxBytes int64

	files, bytes, gitBytes int64
	over                   bool
	skipped                map[string]int
	// configs are the copied files and symlinks named config or
	// config.worktree, for the credential scrub.
	configs []string
	// nested lists a nested repository (a directory git named itself);
	// nil when git's rules are off.
	nested func(ctx context.Context, fd int) (*sel, error)
	// self is the Tree's private directory, never copied into itself
	// when it lies in the tree.
	selfDev, selfIno uint64
	ticks            int
	// specials are the sockets, FIFOs and devices git did not name (it
	// never lists them), by path and kind: skipped, and counted unless
	// git ignores them.
	specials map[string]string
	// copier copies files' data concurrently (nil: one at a time); jobs
	// are the copies of the directory being walked.
	copier *copier
	jobs   *dirJobs
}

// noteSpecials notes the special files of the directory src (at rel) that
// git did not name.
func (w *walker) noteSpecials(src *os.File, rel string, s *sel) error {
	all, err := src.Readdirnames(-1)
	if err != nil {
		return fmt.Errorf("listing %s: %w", show(rel), err)
	}
	if _, err := src.Seek(0, 0); err != nil {
		return fmt.Errorf("listing %s: %w", show(rel), err)
	}
	for _, name := range all {
		if _, named := s.kids[name]; named {
			continue
		}
		var st unix.Stat_t
		if unix.Fstatat(int(src.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		kind := ""
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFSOCK:
			kind = SkippedSocket
		case unix.S_IFIFO:
			kind = SkippedFIFO
		case unix.S_IFCHR, unix.S_IFBLK:
			kind = SkippedDevice
		}
		if kind != "" {
			if w.specials == nil {
				w.specials = map[string]string{}
			}
			w.specials[join(rel, name)] = kind
		}
	}
	return nil
}

func join(rel, name string) string {
	if rel == "" {
		return name
	}
	return rel + "/" + name
}

// copyDir copies the entries s chooses from the open directory src into
// dst (-1 once over a cap).
func (w *walker) copyDir(src *os.File, dst int, rel string, s *sel) (err error) {
	jobs, outer := w.copier.dir(), w.jobs
	w.jobs = jobs
	defer func() {
		w.jobs = outer
		if werr := jobs.wait(); err == nil {
			err = werr
		}
	}()
	var names []string
	if s.all {
		var err error
		if names, err = src.Readdirnames(-1); err != nil {
			return fmt.Errorf("listing %s: %w", show(rel), err)
		}
	} else {
		for name := range s.kids {
			// Git never names these; a name is only ever one entry
			// of this directory.
			if name != "" && name != "." && name != ".." && !strings.Contains(name, "/") {
				names = append(names, name)
			}
		}
		if err := w.noteSpecials(src, rel, s); err != nil {
			return err
		}
	}
	sort.Strings(names)
	sfd := int(src.Fd())
	for _, name := range names {
		if w.ticks++; w.ticks%256 == 0 {
			if err := w.ctx.Err(); err != nil {
				return fmt.Errorf("copying the workspace: %w", err)
			}
		}
		k := s.child(name)
		err := w.entry(sfd, dst, join(rel, name), name, k)
		if errors.Is(err, errChanged) {
			err = w.entry(sfd, dst, join(rel, name), name, k)
		}
		if errors.Is(err, errChanged) {
			return fmt.Errorf("%s %w; run again once the tree is quiet: %w",
				show(join(rel, name)), ErrKeptChanging, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// show names a path of the tree in messages.
func show(rel string) string {
	if rel == "" {
		return "the workspace root"
	}
	return rel
}

// entry copies one entry, never following a symlink.
func (w *walker) entry(sfd, dst int, rel, name string, s *sel) error {
	var st unix.Stat_t
	if err := unix.Fstatat(sfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // gone, or deleted from the work tree while still tracked
		}
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	take := s.all || s.leaf // a non-directory is copied only when named
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		if st.Dev == w.selfDev && st.Ino == w.selfIno {
			return nil
		}
		return w.dir(sfd, dst, rel, name, &st, s)
	case unix.S_IFREG:
		if take && strings.HasSuffix(name, ".lock") && inGitDir(rel) {
			w.skipped[SkippedGitLock]++
			return nil
		}
		if take {
			return w.file(sfd, dst, rel, name, &st)
		}
	case unix.S_IFLNK:
		if take {
			return w.symlink(sfd, dst, rel, name, &st)
		}
	case unix.S_IFSOCK:
		w.skip(take, SkippedSocket)
	case unix.S_IFIFO:
		w.skip(take, SkippedFIFO)
	default:
		w.skip(take, SkippedDevice)
	}
	return nil
}

func (w *walker) skip(take bool, kind string) {
	if take {
		w.skipped[kind]++
	}
}

// inGitDir reports whether rel lies in a .git directory.
func inGitDir(rel string) bool {
	return strings.HasPrefix(rel, ".git/") || strings.Contains(rel, "/.git/")
}

// count adds an entry and its bytes, and notes a passed cap.
func (w *walker) count(rel string, size int64) error {
	w.files++
	w.bytes += size
	if rel == ".git" || strings.HasPrefix(rel, ".git/") {
		w.gitBytes += size
	}
	if w.files > w.maxFiles || w.bytes > w.maxBytes {
		w.over = true
	}
	if w.files > 10*w.maxFiles {
		return errStop
	}
	return nil
}

func (w *walker) dir(sfd, dst int, rel, name string, st *unix.Stat_t, s *sel) error {
	if testHookBeforeOpenDir != nil {
		testHookBeforeOpenDir(rel)
	}
	fd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP), errors.Is(err, unix.ENOTDIR):
		return errChanged
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EACCES):
		w.skipped[SkippedUnreadable]++
		return nil
	case err != nil:
		return fmt.Errorf("opening %s: %w", rel, err)
	}
	src := os.NewFile(uintptr(fd), rel)
	defer src.Close()
	if !s.all && s.leaf && w.nested != nil {
		// Git named a directory: a submodule or a nested repository,
		// listed by its own rules.
		n, err := w.nested(w.ctx, fd)
		if err != nil {
			return fmt.Errorf("listing nested repository %s: %w", rel, err)
		}
		for k, v := range s.kids {
			if n.kids == nil {
				n.kids = map[string]*sel{}
			}
			if n.kids[k] == nil {
				n.kids[k] = v
			}
		}
		s = n
	}
	if err := w.count(rel, 0); err != nil {
		return err
	}
	sub := -1
	if !w.over {
		if err := unix.Mkdirat(dst, name, 0o700); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		if sub, err = unix.Openat(dst, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0); err != nil {
			return fmt.Errorf("staging %s: %w", rel, err)
		}
		defer unix.Close(sub)
	}
	if err := w.copyDir(src, sub, rel, s); err != nil {
		return err
	}
	if w.over {
		return nil
	}
	// Mode and time last: a read-only directory is filled first, and
	// filling it moves its time.
	if err := unix.Fchmod(sub, st.Mode&0o777); err != nil {
		return fmt.Errorf("staging %s: %w", rel, err)
	}
	return setTime(dst, name, rel, st.Mtim)
}

func (w *walker) file(sfd, dst int, rel, name string, st *unix.Stat_t) error {
	if w.over {
		return w.count(rel, st.Size)
	}
	// O_NONBLOCK: a file swapped for a FIFO must not block the open.
	fd, err := unix.Openat(sfd, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	switch {
	case errors.Is(err, unix.ELOOP):
		return errChanged
	case errors.Is(err, unix.ENOENT):
		return nil
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		w.skipped[SkippedUnreadable]++
		return nil
	case err != nil:
		return fmt.Errorf("opening %s: %w", rel, err)
	}
	src := os.NewFile(uintptr(fd), rel)
	var fst unix.Stat_t
	if err := unix.Fstat(fd, &fst); err != nil {
		src.Close()
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	if fst.Mode&unix.S_IFMT != unix.S_IFREG {
		src.Close()
		return errChanged
	}
	if err := w.count(rel, fst.Size); err != nil || w.over {
		src.Close()
		return err
	}
	w.noteConfig(rel)
	shrunk, err := w.jobs.run(func() (int64, error) {
		defer src.Close()
		return stageFile(src, dst, rel, name, &fst)
	})
	w.bytes -= shrunk
	return err
}

func (w *walker) symlink(sfd, dst int, rel, name string, st *unix.Stat_t) error {
	target, err := readlinkat(sfd, name)
	switch {
	case errors.Is(err, unix.EINVAL):
		return errChanged // no longer a link
	case errors.Is(err, unix.ENOENT):
		return nil
	case err != nil:
		return fmt.Errorf("reading link %s: %w", rel, err)
	}
	if err := w.count(rel, 0); err != nil || w.over {
		return err
	}
	if err := unix.Symlinkat(target, dst, name); err != nil {
		return fmt.Errorf("staging %s: %w", rel, err)
	}
	w.noteConfig(rel)
	return setTime(dst, name, rel, st.Mtim)
}

// noteConfig notes rel for the credential scrub when it is named like a
// repository's config.
func (w *walker) noteConfig(rel string) {
	if strings.HasSuffix("/"+rel, "/config") || strings.HasSuffix("/"+rel, "/config.worktree") {
		w.configs = append(w.configs, rel)
	}
}

// readlinkat reads a link's target, however long.
func readlinkat(dirfd int, name string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		n, err := unix.Readlinkat(dirfd, name, buf)
		if err != nil {
			return "", err
		}
		if n < size {
			return string(buf[:n]), nil
		}
	}
}

// setTime sets an entry's access and modification times to mtime, without
// following a link.
func setTime(dirfd int, name, rel string, mtime unix.Timespec) error {
	ts := []unix.Timespec{mtime, mtime}
	if err := unix.UtimesNanoAt(dirfd, name, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("staging %s: setting its time: %w", rel, err)
	}
	return nil
}
