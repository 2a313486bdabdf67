package store

import (
	"context"
	"fmt"
	"io"
	"os"
	"sort"
	"strconv"

	"github.com/zeebo/blake3"
)

// Entry types in a DiffResult.
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeOther   = "other" // devices, fifos, sockets
)

// Entry is one path that differs between two stages. Size is the size in
// the newer stage (0 for removed paths and directories), OldSize the size
// in the older one (0 for added paths and directories).
type Entry struct {
	Path    string `json:"path"`
	Type    string `json:"type"`
	OldType string `json:"old_type,omitempty"` // set when the type changed
	Size    int64  `json:"size"`
	OldSize int64  `json:"old_size"`
}

// DiffResult lists what changed from stage A to stage B, each list sorted
// by path.
type DiffResult struct {
	Added   []Entry `json:"added"`
	Changed []Entry `json:"changed"`
	Removed []Entry `json:"removed"`
}

// Diff compares the filesystems stages a and b (references, see Resolve)
// give over the base image: each stage's chain of layers merged with the
// overlay rules (whiteouts delete, opaque directories hide what is below).
// The base image itself is not part of the comparison. A path is changed
// when its type, size, mode, owner or content differ. Layers are read on
// the host with debugfs; nothing is mounted.
func (s *Store) Diff(ctx context.Context, a, b string) (DiffResult, error) {
	ma, err := s.Resolve(a)
	if err != nil {
		return DiffResult{}, err
	}
	mb, err := s.Resolve(b)
	if err != nil {
		return DiffResult{}, err
	}
	ca, err := s.Chain(ma)
	if err != nil {
		return DiffResult{}, err
	}
	cb, err := s.Chain(mb)
	if err != nil {
		return DiffResult{}, err
	}
	bin, err := findDebugfs()
	if err != nil {
		return DiffResult{}, err
	}
	layers := map[string]*layerFS{}
	merge := func(chain []Meta) (*node, error) {
		root := &node{typ: TypeDir, children: map[string]*node{}}
		for _, m := range chain {
			l, ok := layers[m.ID]
			if !ok {
				l = &layerFS{id: m.ID, path: s.LayerPath(m.ID), bin: bin}
				if err := l.load(ctx); err != nil {
					return nil, fmt.Errorf("reading layer of stage %s: %w", m, err)
				}
				layers[m.ID] = l
			}
			if l.upper != nil {
				applyDir(root, l.upper)
			}
		}
		return root, nil
	}
	ra, err := merge(ca)
	if err != nil {
		return DiffResult{}, err
	}
	rb, err := merge(cb)
	if err != nil {
		return DiffResult{}, err
	}
	d := &differ{}
	d.compare(ra, rb, "")
	if err := d.settle(ctx); err != nil {
		return DiffResult{}, err
	}
	return d.res, nil
}

// applyDir lays the layer directory src over the merged directory dst.
func applyDir(dst, src *node) {
	if src.opaque {
		dst.children = map[string]*node{}
	}
	for name, c := range src.children {
		if c.whiteout {
			delete(dst.children, name)
			continue
		}
		cp := *c
		if c.typ != TypeDir {
			dst.children[name] = &cp
			continue
		}
		if ex := dst.children[name]; ex != nil && ex.typ == TypeDir && !c.opaque {
			cp.children = ex.children
		} else {
			cp.children = map[string]*node{}
		}
		dst.children[name] = &cp
		applyDir(&cp, c)
	}
}

// differ walks two merged trees.
type differ struct {
	res DiffResult
	// pending holds regular files whose content must be compared.
	pending []pendingPair
}

type pendingPair struct {
	path string
	a, b *node
}

func (d *differ) compare(a, b *node, dir string) {
	names := make([]string, 0, len(a.children)+len(b.children))
	for n := range a.children {
		names = append(names, n)
	}
	for n := range b.children {
		if _, ok := a.children[n]; !ok {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		p := dir + "/" + n
		x, y := a.children[n], b.children[n]
		switch {
		case x == nil:
			d.subtree(&d.res.Added, y, p, false)
		case y == nil:
			d.subtree(&d.res.Removed, x, p, true)
		case x.typ != y.typ:
			d.res.Changed = append(d.res.Changed, Entry{Path: p, Type: y.typ, OldType: x.typ, Size: y.entrySize(), OldSize: x.entrySize()})
			if x.typ == TypeDir {
				d.children(&d.res.Removed, x, p, true)
			}
			if y.typ == TypeDir {
				d.children(&d.res.Added, y, p, false)
			}
		case x.typ == TypeDir:
			if x.mode != y.mode || x.uid != y.uid || x.gid != y.gid {
				d.res.Changed = append(d.res.Changed, Entry{Path: p, Type: TypeDir})
			}
			d.compare(x, y, p)
		case x.sameOrigin(y):
		case x.mode != y.mode || x.uid != y.uid || x.gid != y.gid || x.size != y.size || x.extra != y.extra:
			d.res.Changed = append(d.res.Changed, Entry{Path: p, Type: y.typ, Size: y.size, OldSize: x.size})
		case x.typ == TypeFile && x.size > 0:
			d.pending = append(d.pending, pendingPair{path: p, a: x, b: y})
		}
	}
}

// subtree records n at path p and everything below it.
func (d *differ) subtree(list *[]Entry, n *node, p string, old bool) {
	e := Entry{Path: p, Type: n.typ}
	if old {
		e.OldSize = n.entrySize()
	} else {
		e.Size = n.entrySize()
	}
	*list = append(*list, e)
	d.children(list, n, p, old)
}

func (d *differ) children(list *[]Entry, n *node, p string, old bool) {
	names := make([]string, 0, len(n.children))
	for c := range n.children {
		names = append(names, c)
	}
	sort.Strings(names)
	for _, c := range names {
		d.subtree(list, n.children[c], p+"/"+c, old)
	}
}

// settle compares the content of the pending files and sorts the result.
func (d *differ) settle(ctx context.Context) error {
	want := map[*layerFS][]uint32{}
	for _, pp := range d.pending {
		want[pp.a.layer] = append(want[pp.a.layer], pp.a.ino)
		want[pp.b.layer] = append(want[pp.b.layer], pp.b.ino)
	}
	for l, inos := range want {
		if err := l.hashFiles(ctx, inos); err != nil {
			return err
		}
	}
	for _, pp := range d.pending {
		if pp.a.layer.sums[pp.a.ino] != pp.b.layer.sums[pp.b.ino] {
			d.res.Changed = append(d.res.Changed, Entry{Path: pp.path, Type: TypeFile, Size: pp.b.size, OldSize: pp.a.size})
		}
	}
	sort.Slice(d.res.Changed, func(i, j int) bool { return d.res.Changed[i].Path < d.res.Changed[j].Path })
	return nil
}

// hashBatchBytes bounds how much file data one dump batch writes to the
// temporary directory.
const hashBatchBytes = 256 << 20

// hashFiles fills l.sums for the given regular-file inodes.
func (l *layerFS) hashFiles(ctx context.Context, inos []uint32) error {
	if l.sums == nil {
		l.sums = map[uint32][32]byte{}
	}
	tmp, err := os.MkdirTemp("", "isopod-diff-")
	if err != nil {
		return fmt.Errorf("creating diff scratch directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	seen := map[uint32]bool{}
	var batch []uint32
	var batchBytes int64
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		cmds := make([]string, len(batch))
		for i, ino := range batch {
			cmds[i] = "dump <" + strconv.FormatUint(uint64(ino), 10) + "> " + "i" + strconv.FormatUint(uint64(ino), 10)
		}
		if _, err := debugfsRun(ctx, l.bin, l.path, tmp, cmds); err != nil {
			return err
		}
		for _, ino := range batch {
			sum, err := hashFile(dumpName(tmp, ino))
			if err != nil {
				return fmt.Errorf("hashing inode %d of %s: %w", ino, l.path, err)
			}
			l.sums[ino] = sum
		}
		batch, batchBytes = batch[:0], 0
		return nil
	}
	for _, ino := range inos {
		if _, ok := l.sums[ino]; ok || seen[ino] {
			continue
		}
		seen[ino] = true
		batch = append(batch, ino)
		batchBytes += l.sizes[ino]
		if batchBytes >= hashBatchBytes || len(batch) >= 2000 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// hashFile hashes a dumped file and removes it.
func hashFile(path string) ([32]byte, error) {
	var sum [32]byte
	f, err := os.Open(path)
	if err != nil {
		return sum, err
	}
	defer os.Remove(path)
	defer f.Close()
	h := blake3.New()
	if _, err := io.Copy(h, f); err != nil {
		return sum, err
	}
	copy(sum[:], h.Sum(nil))
	return sum, nil
}
