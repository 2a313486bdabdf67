package store

import (
	"context"
	"fmt"
	"os"
	"strconv"
)

// File type bits of st_mode.
const (
	sIFMT   = 0o170000
	sIFDIR  = 0o040000
	sIFREG  = 0o100000
	sIFLNK  = 0o120000
	sIFCHR  = 0o020000
	sIFBLK  = 0o060000
	rootIno = 2
)

// node is a file in a layer's upper tree, or in a merged view of a chain.
type node struct {
	typ      string
	mode     uint32
	uid, gid uint32
	size     int64
	extra    string // symlink target, or "major:minor" of a device
	layer    *layerFS
	ino      uint32
	opaque   bool // directory carrying trusted.overlay.opaque=y
	whiteout bool // 0:0 character device
	children map[string]*node
}

// entrySize is the size a diff entry reports (0 for directories).
func (n *node) entrySize() int64 {
	if n.typ == TypeDir {
		return 0
	}
	return n.size
}

// sameOrigin reports whether two nodes are the same inode of the same
// layer, hence identical.
func (n *node) sameOrigin(o *node) bool { return n.layer == o.layer && n.ino == o.ino }

// layerFS is the upper tree of one stage layer, read with debugfs.
type layerFS struct {
	id, path, bin string
	upper         *node // nil when the layer has no /upper
	sizes         map[uint32]int64
	sums          map[uint32][32]byte
}

func typeOf(mode uint32) string {
	switch mode & sIFMT {
	case sIFDIR:
		return TypeDir
	case sIFREG:
		return TypeFile
	case sIFLNK:
		return TypeSymlink
	}
	return TypeOther
}

func inoRef(ino uint32) string { return "<" + strconv.FormatUint(uint64(ino), 10) + ">" }

// load reads the layer's /upper tree breadth first: one debugfs
// invocation per directory level lists every directory of that level and
// reads its opaque xattr, and stats the devices and symlinks found one
// level up.
func (l *layerFS) load(ctx context.Context) error {
	l.sizes = map[uint32]int64{}
	if err := l.loadRoot(ctx); err != nil {
		return err
	}
	if l.upper == nil {
		return nil
	}
	dirs := []*node{l.upper}
	visited := map[uint32]bool{l.upper.ino: true}
	var stats []*node
	for len(dirs) > 0 || len(stats) > 0 {
		var err error
		dirs, stats, err = l.loadLevel(ctx, dirs, stats, visited)
		if err != nil {
			return err
		}
	}
	return nil
}

// loadRoot lists the layer's root directory and sets l.upper when it has
// an /upper directory.
func (l *layerFS) loadRoot(ctx context.Context) error {
	secs, err := debugfsRun(ctx, l.bin, l.path, os.TempDir(), []string{"ls -l -p " + inoRef(rootIno)})
	if err != nil {
		return err
	}
	ents, err := parseLsP(secs[0])
	if err != nil {
		return fmt.Errorf("listing root of %s: %w", l.path, err)
	}
	if len(ents) == 0 {
		return fmt.Errorf("%s: debugfs listed an empty root directory; is it an ext4 image?", l.path)
	}
	for _, e := range ents {
		if e.name == "upper" && typeOf(e.mode) == TypeDir {
			l.upper = &node{typ: TypeDir, mode: e.mode, uid: e.uid, gid: e.gid, layer: l, ino: e.ino, children: map[string]*node{}}
		}
	}
	return nil
}

// loadLevel reads one level of the tree in one debugfs invocation: it
// lists dirs and reads their opaque xattrs, and stats the devices and
// symlinks of stats. It returns the directories and the nodes to stat of
// the next level. visited holds the directory inodes seen so far.
func (l *layerFS) loadLevel(ctx context.Context, dirs, stats []*node, visited map[uint32]bool) (nextDirs, nextStats []*node, err error) {
	var cmds []string
	for _, d := range dirs {
		cmds = append(cmds, "ls -l -p "+inoRef(d.ino), "ea_list "+inoRef(d.ino))
	}
	for _, n := range stats {
		cmds = append(cmds, "stat "+inoRef(n.ino))
	}
	secs, err := debugfsRun(ctx, l.bin, l.path, os.TempDir(), cmds)
	if err != nil {
		return nil, nil, err
	}
	for i, d := range dirs {
		subdirs, toStat, err := l.readDir(d, secs[2*i], secs[2*i+1], visited)
		if err != nil {
			return nil, nil, err
		}
		nextDirs = append(nextDirs, subdirs...)
		nextStats = append(nextStats, toStat...)
	}
	slowLinks := readStats(stats, secs[2*len(dirs):])
	if err := l.readSlowLinks(ctx, slowLinks); err != nil {
		return nil, nil, err
	}
	return nextDirs, nextStats, nil
}

// readDir fills d's children from its listing ls and its opaque flag from
// its xattrs ea, and records the sizes of its regular files. It returns the
// subdirectories to list and the devices and symlinks to stat.
func (l *layerFS) readDir(d *node, ls, ea []byte, visited map[uint32]bool) (subdirs, toStat []*node, err error) {
	ents, err := parseLsP(ls)
	if err != nil {
		return nil, nil, fmt.Errorf("listing inode %d of %s: %w", d.ino, l.path, err)
	}
	d.opaque = opaqueRe.Match(ea)
	for _, e := range ents {
		n := &node{typ: typeOf(e.mode), mode: e.mode, uid: e.uid, gid: e.gid, size: e.size, layer: l, ino: e.ino}
		d.children[e.name] = n
		switch {
		case n.typ == TypeDir:
			if visited[e.ino] {
				return nil, nil, fmt.Errorf("%s: directory inode %d appears twice; the filesystem is damaged", l.path, e.ino)
			}
			visited[e.ino] = true
			n.size = 0
			n.children = map[string]*node{}
			subdirs = append(subdirs, n)
		case n.typ == TypeFile:
			l.sizes[e.ino] = e.size
		case n.typ == TypeSymlink || e.mode&sIFMT == sIFCHR || e.mode&sIFMT == sIFBLK:
			toStat = append(toStat, n)
		}
	}
	return subdirs, toStat, nil
}

// readStats sets the symlink targets and device numbers of nodes from
// their stat output secs, and marks whiteouts. It returns the symlinks
// whose targets are not inline in the inode.
func readStats(nodes []*node, secs [][]byte) (slowLinks []*node) {
	for i, n := range nodes {
		sec := secs[i]
		if n.typ == TypeSymlink {
			if t, ok := parseFastLink(sec, n.size); ok {
				n.extra = t
			} else {
				slowLinks = append(slowLinks, n)
			}
			continue
		}
		n.extra = parseDevice(sec)
		n.whiteout = n.mode&sIFMT == sIFCHR && n.extra == "0:0"
	}
	return slowLinks
}

// readSlowLinks reads the targets of symlinks stored in data blocks.
func (l *layerFS) readSlowLinks(ctx context.Context, links []*node) error {
	if len(links) == 0 {
		return nil
	}
	tmp, err := os.MkdirTemp("", "isopod-diff-")
	if err != nil {
		return fmt.Errorf("creating diff scratch directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	cmds := make([]string, len(links))
	for i, n := range links {
		cmds[i] = "dump " + inoRef(n.ino) + " i" + strconv.FormatUint(uint64(n.ino), 10)
	}
	if _, err := debugfsRun(ctx, l.bin, l.path, tmp, cmds); err != nil {
		return err
	}
	for _, n := range links {
		b, err := os.ReadFile(dumpName(tmp, n.ino))
		if err != nil {
			return fmt.Errorf("reading symlink inode %d of %s: %w", n.ino, l.path, err)
		}
		n.extra = string(b)
	}
	return nil
}
