package warmpool

import (
	"os"
	"path/filepath"
	"sort"
	"time"

	"isopod/internal/paths"
)

// usesFile counts a snapshot's resumes: one byte is appended per use
// (appends are atomic, so concurrent runs need no lock), and its
// modification time is the last use.
const usesFile = "uses"

// Usage is how much a snapshot is used and what it costs on disk.
type Usage struct {
	Uses     int64
	LastUsed time.Time // the build time when never used
	Bytes    int64     // allocated on disk
}

// Used records one resume from key id's snapshot.
func (c *Catalog) Used(id string) {
	f, err := os.OpenFile(filepath.Join(c.Dir(id), usesFile), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return
	}
	f.Write([]byte{1})
	f.Close()
}

// Usage reports key id's snapshot's use and size.
func (c *Catalog) Usage(id string, m *Meta) Usage {
	u := Usage{Bytes: paths.DirBytes(c.Dir(id))}
	if m != nil {
		u.LastUsed = m.Built
	}
	if st, err := os.Stat(filepath.Join(c.Dir(id), usesFile)); err == nil {
		u.Uses = st.Size()
		if st.ModTime().After(u.LastUsed) {
			u.LastUsed = st.ModTime()
		}
	}
	return u
}

// Enforce keeps the snapshots within maxBytes on disk, retiring the least
// recently used ones first; keep (the one just built) is never retired.
// It returns the keys retired. maxBytes <= 0 means no budget.
func (c *Catalog) Enforce(maxBytes int64, keep string) []string {
	if maxBytes <= 0 {
		return nil
	}
	type entry struct {
		id string
		u  Usage
	}
	var all []entry
	var total int64
	for _, id := range c.IDs() {
		m, err := c.Read(id)
		if err != nil {
			continue
		}
		u := c.Usage(id, m)
		total += u.Bytes
		all = append(all, entry{id, u})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].u.LastUsed.Before(all[j].u.LastUsed) })
	var retired []string
	for _, e := range all {
		if total <= maxBytes {
			break
		}
		if e.id == keep {
			continue
		}
		if ok, freed := c.Retire(e.id, ""); ok {
			total -= freed
			retired = append(retired, e.id)
			c.log.Info("warm pool: evicted the least recently used snapshot", "key", e.id, "freed", freed, "budget", maxBytes)
		}
	}
	return retired
}

// shapeUsesDir (under the state root) counts the runs of shapes that may
// get an assembled snapshot, whether or not they have one: one byte a run,
// like usesFile, in a file named by the assembled snapshot's key.
const shapeUsesDir = "warmpool-uses"

func (c *Catalog) shapeUses() string { return filepath.Join(c.p.Home, shapeUsesDir) }

// Touch marks key id's snapshot used now without counting a resume: a
// plain snapshot is the fallback of the assembled snapshots of its shape,
// and stays as recently used as they are.
func (c *Catalog) Touch(id string) {
	p := filepath.Join(c.Dir(id), usesFile)
	if f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE, 0o600); err == nil {
		f.Close()
		now := time.Now()
		os.Chtimes(p, now, now)
	}
}

// NoteShape records one run of the shape whose assembled snapshot would
// be key id and returns how many runs of it were recorded before this one.
func (c *Catalog) NoteShape(id string) int64 {
	dir := c.shapeUses()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0
	}
	f, err := os.OpenFile(filepath.Join(dir, id), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return 0
	}
	defer f.Close()
	var before int64
	if st, err := f.Stat(); err == nil {
		before = st.Size()
	}
	f.Write([]byte{1})
	return before
}

// ShapeUses is how many runs of key id's shape NoteShape recorded.
func (c *Catalog) ShapeUses(id string) int64 {
	st, err := os.Stat(filepath.Join(c.shapeUses(), id))
	if err != nil {
		return 0
	}
	return st.Size()
}

// RetireOrphans retires the assembled snapshots one of whose stage layers
// is gone (its stage was removed), with their shapes' use counts, and
// returns their keys.
func (c *Catalog) RetireOrphans() []string {
	var retired []string
	for _, id := range c.IDs() {
		m, err := c.Read(id)
		if err != nil || !m.Parts.Assembled || m.LayerGone() == "" {
			continue
		}
		if ok, _ := c.Retire(id, ""); ok {
			os.Remove(filepath.Join(c.shapeUses(), id))
			retired = append(retired, id)
			c.log.Info("warm pool: removed the assembled snapshot of a removed stage", "key", id)
		}
	}
	return retired
}

// LayerGone says which of an assembled snapshot's stage layers is gone
// ("" when none is): its stage was removed.
func (m *Meta) LayerGone() string {
	for i, p := range m.LayerPaths {
		if _, err := os.Stat(p); err != nil {
			id := p
			if i < len(m.Parts.Layers) {
				id = m.Parts.Layers[i]
			}
			return "stage " + id + " was removed"
		}
	}
	return ""
}
