//go:build linux

package workspace

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// ChangeKind says how a path changed.
type ChangeKind int

// The kinds of change. Added and Modified both mean "the path now holds
// this"; the patch is computed against the copy either way.
const (
	Added ChangeKind = iota + 1
	Modified
	Deleted
)

func (k ChangeKind) String() string {
	switch k {
	case Added:
		return "added"
	case Modified:
		return "modified"
	case Deleted:
		return "deleted"
	}
	return fmt.Sprintf("ChangeKind(%d)", int(k))
}

// Change is one path that differs after the run. The core fills these from
// the guest's answers; all of it is untrusted.
//
// A Deleted directory takes everything the copy held below it; a directory
// the guest removed and made again (an opaque directory in the overlay) is
// a Deleted change and an Added one for the same path, with the new
// entries below it. A directory that replaces a file or a link is listed
// itself. Deletions are applied first, then the rest in path order.
type Change struct {
	// Path is relative to the workspace root, slash-separated and clean.
	Path string
	Kind ChangeKind
	// Mode is what the path holds now (Added, Modified): a regular file,
	// fs.ModeSymlink or fs.ModeDir; of the permissions only the owner's
	// execute bit reaches the patch (git keeps no more).
	Mode fs.FileMode
	// Target is a symlink's target.
	Target string
	// Content is the host path of a file holding a regular file's new
	// content.
	Content string
}

// PatchStats count what a patch holds.
type PatchStats struct {
	// Added, Modified and Deleted count the files and symlinks in the
	// patch (a file that became a link counts as modified).
	Added, Modified, Deleted int
	// LeftOut counts changes under .git, which a patch does not carry.
	LeftOut int
	// Ignored counts files the run added that git ignores, left out of
	// the patch (a copy that followed git's rules only).
	Ignored int
	// Bytes is the patch's size.
	Bytes int64
	// LinksOut names, in path order, the symlinks the patch makes whose
	// target leaves the repository (or the tree, outside git): absolute,
	// or climbing above its top with "..", judged by the target's text.
	// Applying the patch makes links the host may then follow.
	LinksOut []string
}

// put is a file or symlink the new tree holds.
type put struct {
	rel     string
	mode    fs.FileMode
	target  string
	content string
}

// plan is what a patch is made of: the original entries it touches, what
// is removed from them, and what the new tree holds in their place.
type plan struct {
	orig    []origEntry
	dels    []string
	puts    []put
	leftOut int
	ignored int
	content int64 // bytes of new content
}

// planner holds the checked changes while the plan is made.
type planner struct {
	root    int // the staging copy
	deleted map[string]bool
	puts    map[string]Change
	orig    map[string]uint32 // chosen original entries by path
}

// ignoreFunc says which of the paths git ignores.
type ignoreFunc func(paths []string) (map[string]bool, error)

// makePlan checks every change and works out the plan. Nothing is read
// through a symlink: a change below one (in the copy or in the new tree)
// is refused. With ignored set, a file or link the copy did not hold that
// git ignores is left out.
func makePlan(root int, changes []Change, ignored ignoreFunc) (*plan, error) {
	p := &plan{}
	pl := &planner{root: root, deleted: map[string]bool{}, puts: map[string]Change{}, orig: map[string]uint32{}}
	for _, c := range changes {
		if err := checkPath(c.Path); err != nil {
			return nil, err
		}
		if underGit(c.Path) {
			p.leftOut++
			continue
		}
		switch c.Kind {
		case Deleted:
			pl.deleted[c.Path] = true
		case Added, Modified:
			if err := checkPut(c); err != nil {
				return nil, err
			}
			if _, dup := pl.puts[c.Path]; dup {
				return nil, fmt.Errorf("change %q is listed twice: %w", c.Path, errdefs.ErrInvalidArgument)
			}
			pl.puts[c.Path] = c
		default:
			return nil, fmt.Errorf("change %q has an unknown kind %d: %w", c.Path, int(c.Kind), errdefs.ErrInvalidArgument)
		}
	}
	var paths []string
	for q := range pl.deleted {
		paths = append(paths, q)
	}
	for q := range pl.puts {
		if !pl.deleted[q] {
			paths = append(paths, q)
		}
	}
	sort.Strings(paths)
	for _, q := range paths {
		if err := pl.checkWay(q); err != nil {
			return nil, err
		}
	}
	if ignored != nil {
		if err := pl.dropIgnored(p, ignored); err != nil {
			return nil, err
		}
	}
	for _, q := range paths {
		if _, ok := pl.puts[q]; !ok && !pl.deleted[q] {
			continue // dropped
		}
		if err := pl.place(p, q); err != nil {
			return nil, err
		}
	}
	for q, m := range pl.orig {
		p.orig = append(p.orig, origEntry{rel: q, mode: m})
	}
	sort.Slice(p.orig, func(i, j int) bool { return p.orig[i].rel < p.orig[j].rel })
	sort.Slice(p.puts, func(i, j int) bool { return p.puts[i].rel < p.puts[j].rel })
	return p, nil
}

// checkPath refuses a path that is not relative and clean.
func checkPath(p string) error {
	bad := ""
	switch {
	case p == "" || p == ".":
		bad = "is empty"
	case strings.ContainsRune(p, 0):
		bad = "holds a NUL byte"
	case strings.HasPrefix(p, "/"):
		bad = "is absolute"
	case len(p) > unix.PathMax:
		bad = fmt.Sprintf("is %d bytes long, over %d", len(p), unix.PathMax)
	case path.Clean(p) != p:
		bad = "is not clean (empty, '.' or '..' components, or a trailing slash)"
	case p == ".." || strings.HasPrefix(p, "../"):
		bad = "climbs out with '..'"
	}
	for _, c := range strings.Split(p, "/") {
		if bad == "" && len(c) > 255 {
			bad = "has a component over 255 bytes"
		}
	}
	if bad != "" {
		return fmt.Errorf("change path %q %s; a change must name a path relative to the workspace: %w", p, bad, errdefs.ErrInvalidArgument)
	}
	return nil
}

// underGit reports whether a path has a .git component, in any case (git
// refuses such paths in a patch).
func underGit(p string) bool {
	for _, c := range strings.Split(p, "/") {
		if strings.EqualFold(c, ".git") {
			return true
		}
	}
	return false
}

// checkPut checks what an added or modified path holds.
func checkPut(c Change) error {
	bad := ""
	switch c.Mode.Type() {
	case 0:
		if !filepath.IsAbs(c.Content) {
			bad = "is a regular file without an absolute content path"
		}
	case fs.ModeSymlink:
		switch {
		case c.Target == "":
			bad = "is a symlink without a target"
		case strings.ContainsRune(c.Target, 0):
			bad = "is a symlink whose target holds a NUL byte"
		case len(c.Target) >= unix.PathMax:
			bad = "is a symlink whose target is too long"
		}
	case fs.ModeDir:
	default:
		bad = fmt.Sprintf("has mode %v; only regular files, symlinks and directories are carried", c.Mode)
	}
	if bad != "" {
		return fmt.Errorf("change %q %s: %w", c.Path, bad, errdefs.ErrInvalidArgument)
	}
	return nil
}

// kind is what a path holds: absent, a directory or something else.
type kind int

const (
	absent kind = iota
	isDir
	isOther
)

// origKind is what the copy holds at q, never reading through a link.
func (pl *planner) origKind(q string) (kind, uint32, error) {
	st, err := lstatBeneath(pl.root, q)
	switch {
	case errors.Is(err, errAbsent):
		return absent, 0, nil
	case err != nil:
		return absent, 0, fmt.Errorf("reading the copy of %s: %w", q, err)
	case st.Mode&unix.S_IFMT == unix.S_IFDIR:
		return isDir, st.Mode, nil
	}
	return isOther, st.Mode, nil
}

// checkWay refuses a change whose way down passes something that is not a
// directory in the new tree: a symlink or a file of the copy left in place,
// or one the guest made.
func (pl *planner) checkWay(q string) error {
	gone := false // the copy holds nothing here any more
	parts := strings.Split(q, "/")
	for i := 1; i < len(parts); i++ {
		up := strings.Join(parts[:i], "/")
		if c, ok := pl.puts[up]; ok {
			if c.Mode.Type() != fs.ModeDir {
				return fmt.Errorf("change %q lies below %q, which the run made a %s; refused: %w", q, up, modeName(c.Mode), errdefs.ErrInvalidArgument)
			}
		}
		if gone {
			continue
		}
		if pl.deleted[up] {
			gone = true
			continue
		}
		k, mode, err := pl.origKind(up)
		if err != nil {
			return err
		}
		_, made := pl.puts[up]
		switch {
		case k == absent:
			gone = true
		case k == isOther && made:
			gone = true // replaced by a directory
		case k == isOther && mode&unix.S_IFMT == unix.S_IFLNK:
			return fmt.Errorf("change %q goes through %q, a symlink in the workspace; refused: %w", q, up, errdefs.ErrInvalidArgument)
		case k == isOther:
			return fmt.Errorf("change %q lies below %q, a file in the workspace; refused: %w", q, up, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// linkLeaves reports whether a symlink at rel (below prefix, the tree's
// place in its repository) whose target is target points outside the
// repository, judged by the text alone.
func linkLeaves(prefix, rel, target string) bool {
	if path.IsAbs(target) {
		return true
	}
	p := path.Join(path.Dir(prefix+rel), target)
	return p == ".." || strings.HasPrefix(p, "../")
}

func modeName(m fs.FileMode) string {
	if m.Type() == fs.ModeSymlink {
		return "symlink"
	}
	return "file"
}

// place adds to the plan what path q takes: the original entries it
// removes or modifies, and what the new tree holds there.
func (pl *planner) place(p *plan, q string) error {
	k, mode, err := pl.origKind(q)
	if err != nil {
		return err
	}
	c, isPut := pl.puts[q]
	newDir := isPut && c.Mode.Type() == fs.ModeDir
	if k != absent {
		switch {
		case pl.deleted[q] || !isPut || (k == isDir) != newDir:
			if err := pl.addOrig(q, k, mode); err != nil {
				return err
			}
			p.dels = append(p.dels, q)
		case k == isOther:
			pl.orig[q] = mode // modified in place
		}
	}
	if isPut && !newDir {
		pt := put{rel: q, mode: c.Mode, target: c.Target, content: c.Content}
		if c.Mode.Type() == 0 {
			fi, err := os.Lstat(c.Content)
			if err != nil || !fi.Mode().IsRegular() {
				return fmt.Errorf("the new content of %q is not a regular file at %s: %w", q, c.Content, errdefs.ErrInvalidArgument)
			}
			p.content += fi.Size()
		}
		p.puts = append(p.puts, pt)
	}
	return nil
}

// dropIgnored leaves out the files and links the run added where the copy
// holds nothing, when git ignores them: build outputs do not belong in a
// patch, and one that already exists on the host would make git apply
// refuse the whole patch.
func (pl *planner) dropIgnored(p *plan, ignored ignoreFunc) error {
	var added []string
	for q, c := range pl.puts {
		if c.Mode.Type() == fs.ModeDir || pl.deleted[q] {
			continue
		}
		k, _, err := pl.origKind(q)
		if err != nil {
			return err
		}
		if k == absent {
			added = append(added, q)
		}
	}
	sort.Strings(added)
	drop, err := ignored(added)
	if err != nil {
		return err
	}
	for q := range drop {
		if _, ok := pl.puts[q]; ok {
			delete(pl.puts, q)
			p.ignored++
		}
	}
	return nil
}

// addOrig chooses the original entry at q, or all those below it.
func (pl *planner) addOrig(q string, k kind, mode uint32) error {
	if k != isDir {
		pl.orig[q] = mode
		return nil
	}
	below, err := filesBeneath(pl.root, q)
	if err != nil {
		return err
	}
	for _, e := range below {
		pl.orig[e.rel] = e.mode
	}
	return nil
}
