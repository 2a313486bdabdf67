package warmpool

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/vmm"
)

// MetaFile is the snapshot's record, written last.
const MetaFile = "warm.json"

const (
	tmpPrefix = ".tmp-"
	oldPrefix = ".old-"
)

// Meta is snapshots/<key>/warm.json.
type Meta struct {
	Key     string    `json:"key"`
	Parts   Key       `json:"parts"`
	BuildID string    `json:"build_id"` // tells a rebuilt snapshot from the one a run tried
	Built   time.Time `json:"built"`
	BuildMS int64     `json:"build_ms"`
	Accel   vmm.Accel `json:"accel"`
	VMM     vmm.Info  `json:"vmm"` // the build's; the key pins the binary
	// LayerPaths are an assembled snapshot's stage layers (root first):
	// the snapshot is dead once one is gone (its stage was removed).
	LayerPaths []string `json:"layer_paths,omitempty"`
}

// ScratchFile is an assembled snapshot's scratch disk as it was at the
// snapshot; each resumed clone writes to a copy of its own.
const ScratchFile = "scratch.ext4"

// Catalog keeps the snapshots under one state root. It is safe for
// concurrent use, within and across processes.
type Catalog struct {
	p   paths.Paths
	log *slog.Logger
}

// New returns the catalog of the state root p.
func New(p paths.Paths, log *slog.Logger) *Catalog {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Catalog{p: p, log: log}
}

// Dir is where the snapshot of key id lives.
func (c *Catalog) Dir(id string) string { return filepath.Join(c.p.Snapshots(), id) }

func (c *Catalog) lockPath(id, kind string) string {
	return filepath.Join(c.p.Locks(), "warm-"+id+"."+kind)
}

// Read returns the record of key id's complete snapshot; an error means
// there is none.
func (c *Catalog) Read(id string) (*Meta, error) {
	dir := c.Dir(id)
	b, err := os.ReadFile(filepath.Join(dir, MetaFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("warm pool: no snapshot %s: %w", id, errdefs.ErrNotFound)
		}
		return nil, err
	}
	m := new(Meta)
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("reading %s: %w", filepath.Join(dir, MetaFile), err)
	}
	if m.Key != id {
		return nil, fmt.Errorf("%s: records key %s: %w", dir, m.Key, errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

// TryBuild takes key id's build lock if nobody holds it. ok is false when
// another builder does; the caller then does without the snapshot.
func (c *Catalog) TryBuild(id string) (unlock func(), ok bool) {
	lk := flock.New(c.lockPath(id, "build"))
	if got, err := lk.TryLock(); err != nil || !got {
		return nil, false
	}
	return func() { lk.Unlock() }, true
}

// Build takes key id's build lock, waiting for another builder until ctx
// ends.
func (c *Catalog) Build(ctx context.Context, id string) (unlock func(), err error) {
	lk := flock.New(c.lockPath(id, "build"))
	if ok, err := lk.TryLockContext(ctx, 100*time.Millisecond); err != nil || !ok {
		return nil, fmt.Errorf("warm pool: waiting for another builder of %s: %w", id, err)
	}
	return func() { lk.Unlock() }, nil
}

// Use holds key id's snapshot in place (a shared lock) while a VMM loads
// it; Publish and Retire wait for every user. Waiting for a Publish or a
// Retire in progress ends with ctx.
func (c *Catalog) Use(ctx context.Context, id string) (release func(), err error) {
	lk := flock.New(c.lockPath(id, "lock"))
	if ok, err := lk.TryRLockContext(ctx, lockPoll); err != nil || !ok {
		return nil, fmt.Errorf("warm pool: waiting to load %s: %w", id, orCtx(ctx, err))
	}
	return func() { lk.Unlock() }, nil
}

// lockPoll is how often a wait for a snapshot's lock tries again.
const lockPoll = 50 * time.Millisecond

// retireWait bounds how long Retire waits for the snapshot's users: a
// VMM loading it for longer than that is stuck, and the snapshot is left
// for the next Retire or GC.
const retireWait = 30 * time.Second

// orCtx is err, or ctx's error when a wait ended without one.
func orCtx(ctx context.Context, err error) error {
	if err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return context.DeadlineExceeded
}

// Stage makes an empty directory for a new snapshot of key id. The builder
// holds id's build lock, writes the VMM's files into it and publishes it
// with Publish, or removes it.
func (c *Catalog) Stage(id string) (string, error) {
	if err := c.p.Ensure(); err != nil {
		return "", err
	}
	tmp := filepath.Join(c.p.Snapshots(), tmpPrefix+id+"-"+randomHex(4))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return "", fmt.Errorf("warm pool: %w", err)
	}
	return tmp, nil
}

// Publish writes m into the staged directory tmp and moves it to m.Key's
// place, replacing (and then removing) a previous snapshot. Runs loading
// the previous one finish first; waiting for them ends with ctx.
func (c *Catalog) Publish(ctx context.Context, tmp string, m *Meta) error {
	if m.BuildID == "" {
		m.BuildID = randomHex(8)
	}
	if err := writeJSON(filepath.Join(tmp, MetaFile), m); err != nil {
		return err
	}
	lk := flock.New(c.lockPath(m.Key, "lock"))
	if ok, err := lk.TryLockContext(ctx, lockPoll); err != nil || !ok {
		return fmt.Errorf("warm pool: waiting for the users of %s: %w", m.Key, orCtx(ctx, err))
	}
	dir := c.Dir(m.Key)
	old := ""
	if _, err := os.Stat(dir); err == nil {
		old = filepath.Join(c.p.Snapshots(), oldPrefix+m.Key+"-"+randomHex(4))
		if err := os.Rename(dir, old); err != nil {
			lk.Unlock()
			return fmt.Errorf("warm pool: replacing %s: %w", m.Key, err)
		}
	}
	err := os.Rename(tmp, dir)
	lk.Unlock()
	if old != "" {
		os.RemoveAll(old)
	}
	if err != nil {
		return fmt.Errorf("warm pool: publishing %s: %w", m.Key, err)
	}
	return nil
}

// Retire removes key id's snapshot if it is still the build buildID (""
// means whatever is there). It reports whether it removed one and the
// bytes freed.
func (c *Catalog) Retire(id, buildID string) (bool, int64) {
	lk := flock.New(c.lockPath(id, "lock"))
	ctx, cancel := context.WithTimeout(context.Background(), retireWait)
	defer cancel()
	if ok, err := lk.TryLockContext(ctx, lockPoll); err != nil || !ok {
		c.log.Warn("warm pool: a snapshot's users did not let go; leaving it", "key", id, "err", orCtx(ctx, err))
		return false, 0
	}
	dir := c.Dir(id)
	if buildID != "" {
		if m, err := c.Read(id); err == nil && m.BuildID != buildID {
			lk.Unlock()
			return false, 0
		}
	}
	if _, err := os.Lstat(dir); err != nil {
		lk.Unlock()
		return false, 0
	}
	freed := paths.DirBytes(dir)
	old := filepath.Join(c.p.Snapshots(), oldPrefix+id+"-"+randomHex(4))
	err := os.Rename(dir, old)
	lk.Unlock()
	if err != nil {
		c.log.Warn("warm pool: retiring snapshot", "key", id, "err", err)
		return false, 0
	}
	os.RemoveAll(old)
	return true, freed
}

// IDs lists the keys that have a snapshot directory, complete or not.
func (c *Catalog) IDs() []string {
	var ids []string
	ents, _ := os.ReadDir(c.p.Snapshots())
	for _, e := range ents {
		if e.IsDir() && strings.HasPrefix(e.Name(), KeyPrefix) {
			ids = append(ids, e.Name())
		}
	}
	return ids
}

// Resolve finds the one key that starts with prefix.
func (c *Catalog) Resolve(prefix string) (string, error) {
	if !strings.HasPrefix(prefix, KeyPrefix) || strings.ContainsAny(prefix, "/.") || len(prefix) <= len(KeyPrefix) {
		return "", fmt.Errorf("%q: a key looks like wk-0123456789abcdef, or a unique prefix of one (see `isopod warmpool list`): %w", prefix, errdefs.ErrInvalidArgument)
	}
	var found []string
	for _, id := range c.IDs() {
		if strings.HasPrefix(id, prefix) {
			found = append(found, id)
		}
	}
	switch len(found) {
	case 0:
		return "", fmt.Errorf("%s: no such snapshot (see `isopod warmpool list`): %w", prefix, errdefs.ErrNotFound)
	case 1:
		return found[0], nil
	}
	return "", fmt.Errorf("%s: ambiguous, matches %s: %w", prefix, strings.Join(found, ", "), errdefs.ErrInvalidArgument)
}

// GC removes leftovers: replaced snapshots, temporary directories nobody is
// building, incomplete snapshots, and complete ones for which dead (given
// by the caller, who knows the current key) says why they can never be
// used again. It returns the names removed.
func (c *Catalog) GC(dead func(*Meta) string) []string {
	var removed []string
	root := c.p.Snapshots()
	ents, _ := os.ReadDir(root)
	for _, e := range ents {
		name := e.Name()
		path := filepath.Join(root, name)
		switch {
		case strings.HasPrefix(name, oldPrefix):
			os.RemoveAll(path)
			removed = append(removed, name)
		case strings.HasPrefix(name, tmpPrefix):
			unlock, ok := c.TryBuild(tmpKey(name))
			if !ok {
				continue // its builder is still at work
			}
			os.RemoveAll(path)
			unlock()
			removed = append(removed, name)
		case strings.HasPrefix(name, KeyPrefix):
			why := "incomplete"
			if m, err := c.Read(name); err == nil {
				why = dead(m)
			}
			if why == "" {
				continue
			}
			if ok, _ := c.Retire(name, ""); ok {
				c.log.Info("warm pool: removed snapshot", "key", name, "why", why)
				removed = append(removed, name)
			}
		}
	}
	return removed
}

// tmpKey extracts the key from .tmp-<key>-<rand>.
func tmpKey(name string) string {
	rest := strings.TrimPrefix(name, tmpPrefix)
	if i := strings.LastIndexByte(rest, '-'); i > 0 {
		return rest[:i]
	}
	return rest
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
