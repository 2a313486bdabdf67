// Package store keeps isopod's stages: immutable, content-addressed
// filesystem layers. A stage is the ext4 scratch disk of a finished run (an
// overlay upperdir at /upper and workdir at /work inside it) plus a meta.json
// describing where it came from. Later runs mount a stage's chain of layers
// read-only as overlay lowers over a base image.
//
// Layout, under the stages directory:
//
//	<id>/layer.ext4   the layer, sparse, mode 0444
//	<id>/meta.json    Meta
//	.tmp-*            a commit or removal in progress (or an interrupted one;
//	                  GC removes those)
//
// Every read-decide-write step (label uniqueness, vanity name choice, the
// publishing rename, removal) runs under one exclusive file lock, so several
// isopod processes can share a store. A stage directory appears by rename
// only once complete, so readers never see a partial stage.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// MaxChainDepth is the most layers one chain may hold: one disk per layer,
// as many as the guest mounts.
const MaxChainDepth = agentproto.MaxLayers

// BaseRef is the reserved reference to the empty stage (no layers).
const BaseRef = "base"

const (
	layerFile = "layer.ext4"
	metaFile  = "meta.json"
	tmpPrefix = ".tmp-"
	lockName  = "stages.lock"
	// gcMinAge is how old a temporary directory must be before GC may
	// remove it.
	gcMinAge = time.Minute
)

// Options configures a Store.
type Options struct {
	// LocksDir holds the store's lock file. Empty: the stages directory.
	LocksDir string
	// Logger receives debug and warning records. Nil: discard.
	Logger *slog.Logger
	// Version is the isopod version recorded in new stages' meta.
	Version string
}

// Meta is a stage's meta.json.
type Meta struct {
	ID     string `json:"id"`
	Name   string `json:"name"`  // vanity name, adjective-noun derived from the id
	Label  string `json:"label"` // the user's unique label (--commit-as)
	Parent string `json:"parent"`
	// Chain lists the stage ids from the root to this stage, self included.
	Chain      []string `json:"chain"`
	BaseFlavor string   `json:"base_flavor"`
	BaseSHA256 string   `json:"base_sha256"` // empty: made over an unidentified base build
	// Digest is the whole hash the id is the start of ("blake3:" and 64
	// hex digits); empty in stages committed before it was recorded.
	Digest         string    `json:"digest,omitempty"`
	SizeBytes      int64     `json:"size_bytes"` // apparent size of the layer
	AllocatedBytes int64     `json:"allocated_bytes"`
	Created        time.Time `json:"created"` // RFC 3339
	CreatedUnix    int64     `json:"created_unix"`
	Argv           []string  `json:"argv"`
	IsopodVersion  string    `json:"isopod_version"`
}

// IsBase reports whether m is the reserved empty stage "base" (what Resolve
// returns for "base"): a stage with no layers.
func (m Meta) IsBase() bool { return m.ID == "" }

// String names the stage for messages: "label (id, name)".
func (m Meta) String() string {
	if m.IsBase() {
		return BaseRef
	}
	return fmt.Sprintf("%q (%s, %s)", m.Label, m.ID, m.Name)
}

// Store is a stages directory. Its methods are safe for concurrent use by
// several goroutines and processes.
type Store struct {
	dir      string
	lockPath string
	log      *slog.Logger
	version  string
}

// Open opens (creating if needed) the stages directory dir.
func Open(dir string, opts Options) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("opening stage store: empty directory: %w", errdefs.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("opening stage store: %w", err)
	}
	if err := os.MkdirAll(abs, 0o700); err != nil {
		return nil, fmt.Errorf("creating stages directory: %w", err)
	}
	locks := opts.LocksDir
	if locks == "" {
		locks = abs
	} else if err := os.MkdirAll(locks, 0o700); err != nil {
		return nil, fmt.Errorf("creating locks directory: %w", err)
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	name := lockName
	if locks == abs {
		name = "." + lockName
	}
	return &Store{dir: abs, lockPath: filepath.Join(locks, name), log: lg, version: opts.Version}, nil
}

// Dir returns the stages directory.
func (s *Store) Dir() string { return s.dir }

// LayerPath returns the path of stage id's layer file.
func (s *Store) LayerPath(id string) string { return filepath.Join(s.dir, id, layerFile) }

func (s *Store) metaPath(id string) string { return filepath.Join(s.dir, id, metaFile) }

// lock takes the store's exclusive lock; the caller must call the returned
// release.
func (s *Store) lock(ctx context.Context) (func(), error) {
	fl := flock.New(s.lockPath, flock.SetPermissions(0o600))
	ok, err := fl.TryLockContext(ctx, 10*time.Millisecond)
	if err != nil {
		return nil, fmt.Errorf("locking stage store: %w", err)
	}
	if !ok {
		return nil, fmt.Errorf("locking stage store: %w", ctx.Err())
	}
	return func() {
		if err := fl.Close(); err != nil {
			s.log.Warn("unlocking stage store", "err", err)
		}
	}, nil
}

// readMeta loads stage id's meta.json.
func (s *Store) readMeta(id string) (Meta, error) {
	b, err := os.ReadFile(s.metaPath(id))
	if errors.Is(err, os.ErrNotExist) {
		return Meta{}, fmt.Errorf("stage %s: %w (see `isopod stage list`)", id, errdefs.ErrNotFound)
	}
	if err != nil {
		return Meta{}, fmt.Errorf("reading stage meta: %w", err)
	}
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("parsing %s: %w", s.metaPath(id), err)
	}
	if m.ID != id {
		return Meta{}, fmt.Errorf("stage %s: meta.json names id %q: %w", id, m.ID, errdefs.ErrFailedPrecondition)
	}
	return m, nil
}

// Get returns the meta of stage id.
func (s *Store) Get(id string) (Meta, error) {
	if !IDPattern.MatchString(id) {
		return Meta{}, fmt.Errorf("stage id %q: want st- and 16 hex digits: %w", id, errdefs.ErrInvalidArgument)
	}
	return s.readMeta(id)
}

// List returns every published stage, oldest first. Temporary directories
// of commits in progress (or interrupted) are not listed; unreadable stages
// are logged and skipped.
func (s *Store) List() ([]Meta, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing stages: %w", err)
	}
	var out []Meta
	for _, e := range ents {
		if !e.IsDir() || !IDPattern.MatchString(e.Name()) {
			continue
		}
		m, err := s.readMeta(e.Name())
		if err != nil {
			if !errors.Is(err, errdefs.ErrNotFound) {
				s.log.Warn("skipping unreadable stage", "id", e.Name(), "err", err)
			}
			continue
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out, nil
}

// Chain returns m's chain of stages, root first, m last. The base stage has
// an empty chain.
func (s *Store) Chain(m Meta) ([]Meta, error) {
	if m.IsBase() {
		return nil, nil
	}
	if len(m.Chain) == 0 || m.Chain[len(m.Chain)-1] != m.ID {
		return nil, fmt.Errorf("stage %s: chain %v does not end with itself: %w", m.ID, m.Chain, errdefs.ErrFailedPrecondition)
	}
	out := make([]Meta, 0, len(m.Chain))
	for i, id := range m.Chain {
		if id == m.ID {
			if i != len(m.Chain)-1 {
				return nil, fmt.Errorf("stage %s: chain %v lists itself twice: %w", m.ID, m.Chain, errdefs.ErrFailedPrecondition)
			}
			out = append(out, m)
			continue
		}
		p, err := s.readMeta(id)
		if errors.Is(err, errdefs.ErrNotFound) {
			return nil, fmt.Errorf("stage %s: layer %s of its chain is missing: %w", m.ID, id, errdefs.ErrFailedPrecondition)
		}
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// Log returns the chain of the stage ref names, root first (see Resolve).
func (s *Store) Log(ref string) ([]Meta, error) {
	m, err := s.Resolve(ref)
	if err != nil {
		return nil, err
	}
	return s.Chain(m)
}

// isTemp reports whether a directory entry name is a temporary directory.
func isTemp(name string) bool { return strings.HasPrefix(name, tmpPrefix) }
