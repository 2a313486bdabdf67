package hostio

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// A host path named by a tool argument is resolved beneath the host-I/O
// root one component at a time, each opened relative to a descriptor of
// the directory before it (O_PATH|O_NOFOLLOW), and never by its name
// again: what is checked is what is opened, so swapping a directory for a
// symlink between a check and an open (renameat2 RENAME_EXCHANGE in a
// loop) cannot redirect a read or a write. The walk is the kernel's
// RESOLVE_BENEATH done in userspace, so that it can also follow what
// openat2 refuses but the host-I/O rules allow: an absolute symlink whose
// target lies inside the root.
//
//   - ".." steps back to the directory the walk came from (a descriptor it
//     holds), never above the root.
//   - A symlink is read from its own descriptor. A relative target is
//     walked from where the link is; an absolute one must name the root
//     or a path below it and is walked from the root; anything else is
//     refused without being looked at.
//   - Every directory passed through is compared, by device and inode,
//     with the state root, which is refused wherever it is reached from.

// maxLinks bounds the symlinks one walk follows, as the kernel's 40.
const maxLinks = 40

// walkMode is what a walk is for.
type walkMode int

const (
	walkRead   walkMode = iota // the final component must exist
	walkCheck                  // missing parents are allowed; nothing is created
	walkCreate                 // missing parents are created, descriptor-relative
)

// walkErr is why a walk stopped; Policy words it for the argument.
type walkErr struct {
	kind   walkKind
	path   string // the path as resolved so far, or the link's target
	detail string
}

type walkKind int

const (
	errOutside     walkKind = iota // resolves outside the root
	errHome                        // inside the state root
	errDangling                    // a symlink whose target is missing or loops
	errNotDir                      // a non-directory used as a directory
	errDotDotAfter                 // ".." below a directory that does not exist
	errMissing                     // the final component does not exist
	errChanged                     // the tree changed under the walk
	errSys                         // a system call failed
)

func (e *walkErr) Error() string { return e.path + ": " + e.detail }

// walked is where a walk ended: the final component's parent directory,
// open, and the final component itself when it exists.
type walked struct {
	path string   // the resolved path, for messages and reports
	dir  *os.File // the parent directory (O_PATH); nil when parents are missing (walkCheck)
	name string   // the final component's name in dir
	file *os.File // O_PATH descriptor of the final component; nil when missing
	st   unix.Stat_t
}

// close releases the walk's descriptors.
func (w *walked) close() {
	if w.dir != nil {
		w.dir.Close()
	}
	if w.file != nil {
		w.file.Close()
	}
}

// walker is one resolution beneath a root.
type walker struct {
	root   string // canonical root
	alias  string // the root as configured, when it differs
	home   string // the state root's path
	homeID *unix.Stat_t
	stack  []int    // directory descriptors; stack[0] is the root
	names  []string // the names pushed after the root
	links  int
}

// components splits a path into its names, dropping empty and "." ones.
func components(p string) []string {
	return slices.DeleteFunc(strings.Split(p, "/"), func(c string) bool { return c == "" || c == "." })
}

// under returns comps relative to the root or its alias, if they name one
// of them or a path below.
func (w *walker) under(comps []string) ([]string, bool) {
	for _, r := range []string{w.root, w.alias} {
		if r == "" {
			continue
		}
		rc := components(r)
		if len(comps) >= len(rc) && slices.Equal(comps[:len(rc)], rc) {
			return comps[len(rc):], true
		}
	}
	return nil, false
}

// here is the path the walk has reached.
func (w *walker) here(more ...string) string {
	return filepath.Join(append([]string{w.root}, append(slices.Clone(w.names), more...)...)...)
}

func (w *walker) top() int { return w.stack[len(w.stack)-1] }

// open starts a walk at the root.
func (w *walker) open() error {
	fd, err := unix.Open(w.root, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &walkErr{errSys, w.root, "opening the host-I/O root: " + err.Error()}
	}
	w.stack = []int{fd}
	if w.home != "" {
		var st unix.Stat_t
		if unix.Stat(w.home, &st) == nil {
			w.homeID = &st
		}
	}
	return w.checkDir(fd, w.root)
}

// checkDir refuses the state root, by identity.
func (w *walker) checkDir(fd int, path string) error {
	if w.homeID == nil {
		return nil
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &walkErr{errSys, path, err.Error()}
	}
	if st.Dev == w.homeID.Dev && st.Ino == w.homeID.Ino {
		return &walkErr{errHome, path, "the state directory"}
	}
	return nil
}

func (w *walker) push(fd int, name string) {
	w.stack, w.names = append(w.stack, fd), append(w.names, name)
}

// up follows "..": back to the directory the walk came from. Above the
// root only "/" stays where it is.
func (w *walker) up(rest []string) error {
	if len(w.stack) == 1 {
		if w.root == "/" {
			return nil
		}
		return &walkErr{errOutside, filepath.Join(append([]string{filepath.Dir(w.root)}, rest...)...), `".." leaves the root`}
	}
	unix.Close(w.top())
	w.stack, w.names = w.stack[:len(w.stack)-1], w.names[:len(w.names)-1]
	return nil
}

// restart goes back to the root, for an absolute symlink.
func (w *walker) restart() {
	for _, fd := range w.stack[1:] {
		unix.Close(fd)
	}
	w.stack, w.names = w.stack[:1], nil
}

func (w *walker) closeAll() {
	for _, fd := range w.stack {
		unix.Close(fd)
	}
	w.stack = nil
}

// walk resolves comps (relative to the root) for mode.
func (w *walker) walk(comps []string, mode walkMode) (*walked, error) {
	if err := w.open(); err != nil {
		return nil, err
	}
	defer w.closeAll()
	todo, fromLink := comps, 0
	for len(todo) > 0 {
		c := todo[0]
		todo = todo[1:]
		viaLink := fromLink > 0
		if viaLink {
			fromLink--
		}
		if c == ".." {
			if err := w.up(todo); err != nil {
				return nil, err
			}
			continue
		}
		fd, err := unix.Openat(w.top(), c, unix.O_PATH|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if errors.Is(err, unix.ENOENT) {
			if viaLink {
				return nil, &walkErr{errDangling, w.here(c), "is reached through a symlink that does not resolve (its target is missing)"}
			}
			return w.missing(c, todo, mode)
		}
		if err != nil {
			return nil, &walkErr{errSys, w.here(c), err.Error()}
		}
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil {
			unix.Close(fd)
			return nil, &walkErr{errSys, w.here(c), err.Error()}
		}
		switch {
		case st.Mode&unix.S_IFMT == unix.S_IFLNK:
			more, err := w.follow(fd, c)
			if err != nil {
				return nil, err
			}
			todo, fromLink = append(more, todo...), fromLink+len(more)
		case len(todo) == 0:
			return w.final(fd, c, st)
		case st.Mode&unix.S_IFMT != unix.S_IFDIR:
			unix.Close(fd)
			return nil, &walkErr{errNotDir, w.here(c), "is not a directory"}
		default:
			if err := w.checkDir(fd, w.here(c)); err != nil {
				unix.Close(fd)
				return nil, err
			}
			w.push(fd, c)
		}
	}
	return nil, &walkErr{errNotDir, w.here(), "is a directory"}
}

// follow reads the symlink fd (named c in the directory the walk is in)
// and returns its target's components, to be walked next.
func (w *walker) follow(fd int, c string) ([]string, error) {
	defer unix.Close(fd)
	w.links++
	if w.links > maxLinks {
		return nil, &walkErr{errDangling, w.here(c), "is a symlink that does not resolve (too many levels of links)"}
	}
	buf := make([]byte, unix.PathMax)
	n, err := unix.Readlinkat(fd, "", buf)
	if err != nil {
		return nil, &walkErr{errSys, w.here(c), "reading a symlink: " + err.Error()}
	}
	target := string(buf[:n])
	more := components(target)
	if !filepath.IsAbs(target) {
		return more, nil
	}
	rel, ok := w.under(more)
	if !ok {
		return nil, &walkErr{errOutside, filepath.Clean(target), "a symlink at " + w.here(c) + " points there"}
	}
	w.restart()
	return rel, nil
}

// missing handles a component c that does not exist, with todo after it.
func (w *walker) missing(c string, todo []string, mode walkMode) (*walked, error) {
	if slices.Contains(todo, "..") {
		return nil, &walkErr{errDotDotAfter, w.here(c), `".." below a directory that does not exist`}
	}
	path := w.here(append([]string{c}, todo...)...)
	switch {
	case len(todo) == 0:
		return w.final(-1, c, unix.Stat_t{})
	case mode == walkRead:
		return nil, &walkErr{errMissing, w.here(c), "does not exist"}
	case mode == walkCheck:
		return &walked{path: path}, nil
	}
	if w.home != "" && within(w.home, path) {
		return nil, &walkErr{errHome, path, "the state directory"}
	}
	for _, d := range append([]string{c}, todo[:len(todo)-1]...) {
		if err := unix.Mkdirat(w.top(), d, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return nil, &walkErr{errSys, w.here(d), "creating a directory: " + err.Error()}
		}
		fd, err := unix.Openat(w.top(), d, unix.O_PATH|unix.O_NOFOLLOW|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, &walkErr{errChanged, w.here(d), "changed while it was created (" + err.Error() + ")"}
		}
		w.push(fd, d)
	}
	return w.final(-1, todo[len(todo)-1], unix.Stat_t{})
}

// final ends a walk at component c of the directory on top: fd (-1 when
// c does not exist) becomes the result's file.
func (w *walker) final(fd int, c string, st unix.Stat_t) (*walked, error) {
	dir, err := unix.FcntlInt(uintptr(w.top()), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		if fd >= 0 {
			unix.Close(fd)
		}
		return nil, &walkErr{errSys, w.here(), err.Error()}
	}
	r := &walked{path: w.here(c), dir: os.NewFile(uintptr(dir), w.here()), name: c, st: st}
	if fd >= 0 {
		r.file = os.NewFile(uintptr(fd), r.path)
	}
	if w.home != "" && within(w.home, r.path) {
		r.close()
		return nil, &walkErr{errHome, r.path, "the state directory"}
	}
	return r, nil
}
