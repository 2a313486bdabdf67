package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// An unpacker applies image layers, in order, to a staging directory and
// keeps a tree of what the image's root holds: each entry's type, mode
// (setuid, setgid and sticky included), owner and time. On the host every
// file is the unpacking user's, mode 0600 (directories 0700): no device
// node, no setuid file, no file of another owner is ever created, so
// importing needs no privilege. The tree restores the real metadata when
// the root is packed (see writePseudo).
//
// Paths are resolved in the tree, never on the host: a symbolic link in a
// path is followed inside the image's root (an absolute target starts at
// that root, ".." stops at it), like a chroot would, so no entry lands
// outside the staging directory whatever the links say. Links themselves
// are stored as they are.
//
// Whiteouts (.wh.NAME) and opaque directories (.wh..wh..opq) remove what
// lower layers put there; they do not touch what their own layer adds.
type unpacker struct {
	dir   string // the staging root on the host
	root  *unode
	layer int
	lim   unpackLimits

	bytes   int64
	entries int
	// skipped lists what the image holds that no import keeps: device
	// nodes and FIFOs, as "path (char device 1:3)".
	skipped []string
	buf     []byte
}

// unpackLimits bound one import.
type unpackLimits struct {
	MaxBytes   int64 // file contents, all layers together
	MaxEntries int   // tar entries, all layers together
}

const (
	kindDir byte = 'd'
	kindReg byte = 'f'
	kindSym byte = 'l'

	maxPathBytes = 4096
	maxNameBytes = 255
	maxLinkHops  = 40
	opaqueMarker = ".wh..wh..opq"
	whiteoutPref = ".wh."
)

// unode is one entry of the image's root.
type unode struct {
	kind   byte
	meta   *umeta // shared by the names of a hard-linked file
	target string // a symbolic link's target
	// seen is the last layer that named this entry, as itself or on the
	// way to another: whiteouts and opaque markers remove only what was
	// not seen in their own layer.
	seen     int
	children map[string]*unode
}

// umeta is what the squashfs records of an entry besides its content.
type umeta struct {
	mode     uint32 // permission bits and setuid, setgid, sticky
	uid, gid uint32
	mtime    uint32
}

func newUnpacker(dir string, lim unpackLimits) (*unpacker, error) {
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, err
	}
	root := &unode{kind: kindDir, meta: &umeta{mode: 0o755}, children: map[string]*unode{}}
	return &unpacker{dir: dir, root: root, lim: lim, buf: make([]byte, 1<<20)}, nil
}

// entryError names the layer and entry a refusal is about.
func (u *unpacker) entryError(name, format string, args ...any) error {
	return fmt.Errorf("layer %d, entry %q: %s: %w", u.layer+1, name, fmt.Sprintf(format, args...), errdefs.ErrInvalidArgument)
}

// apply applies one layer's tar stream as layer number layer (0 first).
func (u *unpacker) apply(layer int, r io.Reader) error {
	u.layer = layer
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("layer %d: reading the tar stream: %w", layer+1, err)
		}
		u.entries++
		if u.lim.MaxEntries > 0 && u.entries > u.lim.MaxEntries {
			return fmt.Errorf("the image has more than %d entries: %w", u.lim.MaxEntries, errdefs.ErrInvalidArgument)
		}
		if err := u.entry(h, tr); err != nil {
			return err
		}
	}
}

// cleanName turns a tar entry name into path components under the root;
// nil is the root itself.
func (u *unpacker) cleanName(name string) ([]string, error) {
	if len(name) > maxPathBytes {
		return nil, u.entryError(name[:64]+"...", "path longer than %d bytes", maxPathBytes)
	}
	if !utf8.ValidString(name) || strings.ContainsFunc(name, func(r rune) bool { return r < 0x20 || r == 0x7f }) {
		return nil, u.entryError(name, "control characters or invalid UTF-8 in the path")
	}
	c := path.Clean(strings.TrimLeft(name, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return nil, u.entryError(name, "the path leaves the image's root")
	}
	if c == "." {
		return nil, nil
	}
	comps := strings.Split(c, "/")
	for _, p := range comps {
		if len(p) > maxNameBytes {
			return nil, u.entryError(name, "a name longer than %d bytes", maxNameBytes)
		}
	}
	return comps, nil
}

func metaOf(h *tar.Header) *umeta {
	m := &umeta{mode: uint32(h.Mode) & 0o7777}
	if h.Uid > 0 && h.Uid <= 0xffffffff {
		m.uid = uint32(h.Uid)
	}
	if h.Gid > 0 && h.Gid <= 0xffffffff {
		m.gid = uint32(h.Gid)
	}
	if t := h.ModTime.Unix(); t > 0 && t <= 0xffffffff {
		m.mtime = uint32(t)
	}
	return m
}

// entry applies one tar entry.
func (u *unpacker) entry(h *tar.Header, body io.Reader) error {
	comps, err := u.cleanName(h.Name)
	if err != nil {
		return err
	}
	if comps == nil {
		if h.Typeflag == tar.TypeDir {
			u.root.meta = metaOf(h)
		}
		return nil
	}
	parent, ppath, err := u.walk(comps[:len(comps)-1], true)
	if err != nil {
		return u.entryError(h.Name, "%v", err)
	}
	name := comps[len(comps)-1]
	switch {
	case name == opaqueMarker:
		return u.hideLower(parent, ppath)
	case strings.HasPrefix(name, whiteoutPref+whiteoutPref):
		return nil // other aufs bookkeeping
	case strings.HasPrefix(name, whiteoutPref):
		if old := parent.children[name[len(whiteoutPref):]]; old != nil && old.seen < u.layer {
			return u.remove(parent, ppath, name[len(whiteoutPref):])
		}
		return nil
	}
	host := u.hostPath(append(ppath, name))
	switch h.Typeflag {
	case tar.TypeDir:
		return u.mkdir(parent, ppath, name, metaOf(h))
	case tar.TypeReg, tar.TypeRegA:
		return u.writeFile(parent, ppath, name, h, body)
	case tar.TypeSymlink:
		if h.Linkname == "" || len(h.Linkname) > maxPathBytes || strings.ContainsRune(h.Linkname, 0) {
			return u.entryError(h.Name, "symbolic link with an empty, overlong or NUL-bearing target")
		}
		if err := u.remove(parent, ppath, name); err != nil {
			return err
		}
		if err := os.Symlink(h.Linkname, host); err != nil {
			return fmt.Errorf("unpacking: %w", err)
		}
		parent.children[name] = &unode{kind: kindSym, meta: metaOf(h), target: h.Linkname, seen: u.layer}
		return nil
	case tar.TypeLink:
		return u.hardLink(parent, ppath, name, h)
	case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
		if err := u.remove(parent, ppath, name); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeChar && h.Devmajor == 0 && h.Devminor == 0 {
			return nil // the overlay form of a whiteout
		}
		u.skipped = append(u.skipped, fmt.Sprintf("/%s (%s)", strings.Join(append(ppath, name), "/"), deviceKind(h)))
		return nil
	case tar.TypeXGlobalHeader:
		return nil
	}
	return u.entryError(h.Name, "unsupported tar entry type %q", h.Typeflag)
}

func deviceKind(h *tar.Header) string {
	switch h.Typeflag {
	case tar.TypeChar:
		return fmt.Sprintf("char device %d:%d", h.Devmajor, h.Devminor)
	case tar.TypeBlock:
		return fmt.Sprintf("block device %d:%d", h.Devmajor, h.Devminor)
	}
	return "FIFO"
}

func (u *unpacker) hostPath(comps []string) string {
	return filepath.Join(u.dir, filepath.FromSlash(strings.Join(comps, "/")))
}

// walk resolves the directory comps names, following symbolic links inside
// the root, and returns it with its resolved path. Missing directories are
// created (as 0755 root:root) when create is set.
func (u *unpacker) walk(comps []string, create bool) (*unode, []string, error) {
	stack := []*unode{u.root}
	var names []string
	hops := 0
	for i := 0; i < len(comps); i++ {
		c := comps[i]
		cur := stack[len(stack)-1]
		cur.seen = max(cur.seen, u.layer)
		switch c {
		case "", ".":
			continue
		case "..":
			if len(names) > 0 {
				stack, names = stack[:len(stack)-1], names[:len(names)-1]
			}
			continue
		}
		child := cur.children[c]
		switch {
		case child == nil:
			if !create {
				return nil, nil, fmt.Errorf("/%s does not exist", strings.Join(append(names, c), "/"))
			}
			child = &unode{kind: kindDir, meta: &umeta{mode: 0o755}, seen: u.layer, children: map[string]*unode{}}
			if err := os.Mkdir(u.hostPath(append(names, c)), 0o700); err != nil {
				return nil, nil, fmt.Errorf("unpacking: %w", err)
			}
			cur.children[c] = child
		case child.kind == kindSym:
			if hops++; hops > maxLinkHops {
				return nil, nil, fmt.Errorf("too many levels of symbolic links at /%s", strings.Join(append(names, c), "/"))
			}
			rest := append(strings.Split(child.target, "/"), comps[i+1:]...)
			if strings.HasPrefix(child.target, "/") {
				stack, names = stack[:1], nil
			}
			comps, i = rest, -1
			continue
		case child.kind != kindDir:
			return nil, nil, fmt.Errorf("/%s is not a directory", strings.Join(append(names, c), "/"))
		}
		child.seen = max(child.seen, u.layer)
		stack, names = append(stack, child), append(names, c)
	}
	return stack[len(stack)-1], names, nil
}

// remove deletes parent's entry name and everything below it, if any.
func (u *unpacker) remove(parent *unode, ppath []string, name string) error {
	if _, ok := parent.children[name]; !ok {
		return nil
	}
	if err := os.RemoveAll(u.hostPath(append(ppath, name))); err != nil {
		return fmt.Errorf("unpacking: %w", err)
	}
	delete(parent.children, name)
	return nil
}

// hideLower applies an opaque marker: everything under dir that its own
// layer did not name goes.
func (u *unpacker) hideLower(dir *unode, dpath []string) error {
	for name, c := range dir.children {
		switch {
		case c.seen < u.layer:
			if err := u.remove(dir, dpath, name); err != nil {
				return err
			}
		case c.kind == kindDir:
			if err := u.hideLower(c, append(append([]string(nil), dpath...), name)); err != nil {
				return err
			}
		}
	}
	return nil
}

func (u *unpacker) mkdir(parent *unode, ppath []string, name string, m *umeta) error {
	if old := parent.children[name]; old != nil && old.kind == kindDir {
		old.meta, old.seen = m, u.layer
		return nil
	}
	if err := u.remove(parent, ppath, name); err != nil {
		return err
	}
	if err := os.Mkdir(u.hostPath(append(ppath, name)), 0o700); err != nil {
		return fmt.Errorf("unpacking: %w", err)
	}
	parent.children[name] = &unode{kind: kindDir, meta: m, seen: u.layer, children: map[string]*unode{}}
	return nil
}

func (u *unpacker) writeFile(parent *unode, ppath []string, name string, h *tar.Header, body io.Reader) error {
	if h.Size < 0 || (u.lim.MaxBytes > 0 && u.bytes+h.Size > u.lim.MaxBytes) {
		return fmt.Errorf("the image's files add up to more than the cap of %d MiB (at %q): raise it with --max-mib: %w",
			u.lim.MaxBytes>>20, h.Name, errdefs.ErrInvalidArgument)
	}
	if err := u.remove(parent, ppath, name); err != nil {
		return err
	}
	f, err := os.OpenFile(u.hostPath(append(ppath, name)), os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("unpacking: %w", err)
	}
	n, err := io.CopyBuffer(f, io.LimitReader(body, h.Size), u.buf)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("unpacking %q: %w", h.Name, err)
	}
	if n != h.Size {
		return fmt.Errorf("unpacking %q: %d of %d bytes: %w", h.Name, n, h.Size, io.ErrUnexpectedEOF)
	}
	u.bytes += n
	parent.children[name] = &unode{kind: kindReg, meta: metaOf(h), seen: u.layer}
	return nil
}

func (u *unpacker) hardLink(parent *unode, ppath []string, name string, h *tar.Header) error {
	tcomps, err := u.cleanName(h.Linkname)
	if err != nil || tcomps == nil {
		return u.entryError(h.Name, "hard link to %q, which is not a file in the image", h.Linkname)
	}
	tparent, tpath, err := u.walk(tcomps[:len(tcomps)-1], false)
	if err != nil {
		return u.entryError(h.Name, "hard link to %q: %v", h.Linkname, err)
	}
	tname := tcomps[len(tcomps)-1]
	target := tparent.children[tname]
	if target == nil || target.kind == kindDir {
		return u.entryError(h.Name, "hard link to %q, which is not a file in the image", h.Linkname)
	}
	if parent.children[name] == target {
		return nil
	}
	if err := u.remove(parent, ppath, name); err != nil {
		return err
	}
	if err := os.Link(u.hostPath(append(tpath, tname)), u.hostPath(append(ppath, name))); err != nil {
		return fmt.Errorf("unpacking: %w", err)
	}
	parent.children[name] = &unode{kind: target.kind, meta: target.meta, target: target.target, seen: u.layer}
	return nil
}

// lookup finds the entry at an absolute path, following symbolic links
// (the last one too) inside the root; nil when there is none.
func (u *unpacker) lookup(p string) *unode {
	comps := strings.Split(strings.Trim(path.Clean(p), "/"), "/")
	for hops := 0; hops <= maxLinkHops; hops++ {
		dir, _, err := u.walk(comps[:len(comps)-1], false)
		if err != nil {
			return nil
		}
		n := dir.children[comps[len(comps)-1]]
		if n == nil || n.kind != kindSym {
			return n
		}
		if strings.HasPrefix(n.target, "/") {
			comps = strings.Split(strings.Trim(path.Clean(n.target), "/"), "/")
		} else {
			comps = append(comps[:len(comps)-1], strings.Split(n.target, "/")...)
		}
	}
	return nil
}

// hasShell reports whether /bin/sh is a file in the root.
func (u *unpacker) hasShell() bool {
	n := u.lookup("/bin/sh")
	return n != nil && n.kind == kindReg
}
