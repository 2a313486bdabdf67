// Package storefake is a stage store for fast tests of the core: the
// stages' metas live in memory, their layers are files in one directory,
// and there are no file locks, no fsyncs and no meta.json. It keeps the
// contract of store.Interface (internal/store/storetest checks it) with
// the real store's ids, digests, names and references, within one
// process. It has no Diff: that reads ext4 layers with debugfs.
package storefake

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

const tmpPrefix = ".tmp-"

// Store is an in-memory stage store over a directory of layer files. Safe
// for concurrent use by several goroutines.
type Store struct {
	dir     string
	version string
	log     *slog.Logger

	mu     sync.Mutex // guards following
	stages map[string]store.Meta
	blobs  map[string]store.BlobRecord
	inUse  map[string]bool // temporary directories held by TempDir
}

var _ store.Interface = (*Store)(nil)

// Open makes a fake store keeping its layers in dir (created if needed).
// Of opts, Version and Logger are used.
func Open(dir string, opts store.Options) (*Store, error) {
	if dir == "" {
		return nil, fmt.Errorf("opening fake stage store: empty directory: %w", errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating fake stages directory: %w", err)
	}
	lg := opts.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	return &Store{dir: dir, version: opts.Version, log: lg,
		stages: map[string]store.Meta{}, blobs: map[string]store.BlobRecord{}, inUse: map[string]bool{}}, nil
}

// Dir returns the directory of the layer files.
func (s *Store) Dir() string { return s.dir }

// LayerPath returns where stage id's layer file is.
func (s *Store) LayerPath(id string) string { return filepath.Join(s.dir, id+".ext4") }

// Get returns the meta of stage id.
func (s *Store) Get(id string) (store.Meta, error) {
	if !store.IDPattern.MatchString(id) {
		return store.Meta{}, fmt.Errorf("stage id %q: want st- and 16 hex digits: %w", id, errdefs.ErrInvalidArgument)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(id)
}

// get is Get without the checks; the caller holds s.mu.
func (s *Store) get(id string) (store.Meta, error) {
	m, ok := s.stages[id]
	if !ok {
		return store.Meta{}, fmt.Errorf("stage %s: %w", id, errdefs.ErrNotFound)
	}
	return clone(m), nil
}

// clone copies m's slices, so callers cannot change a kept meta.
func clone(m store.Meta) store.Meta {
	m.Chain = slices.Clone(m.Chain)
	m.Argv = slices.Clone(m.Argv)
	return m
}

// List returns every stage, oldest first.
func (s *Store) List() ([]store.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.list(), nil
}

// list is List; the caller holds s.mu.
func (s *Store) list() []store.Meta {
	out := make([]store.Meta, 0, len(s.stages))
	for _, m := range s.stages {
		out = append(out, clone(m))
	}
	sort.Slice(out, func(i, j int) bool {
		if !out[i].Created.Equal(out[j].Created) {
			return out[i].Created.Before(out[j].Created)
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// Resolve finds the stage ref names (see store.Match).
func (s *Store) Resolve(ref string) (store.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return store.Match(ref, s.list())
}

// Chain returns m's chain, root first; nil for the base.
func (s *Store) Chain(m store.Meta) ([]store.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.chain(m)
}

// chain is Chain; the caller holds s.mu.
func (s *Store) chain(m store.Meta) ([]store.Meta, error) {
	if m.IsBase() {
		return nil, nil
	}
	if len(m.Chain) == 0 || m.Chain[len(m.Chain)-1] != m.ID || slices.Index(m.Chain, m.ID) != len(m.Chain)-1 {
		return nil, fmt.Errorf("stage %s: chain %v does not end with itself, once: %w", m.ID, m.Chain, errdefs.ErrFailedPrecondition)
	}
	out := make([]store.Meta, 0, len(m.Chain))
	for _, id := range m.Chain[:len(m.Chain)-1] {
		p, err := s.get(id)
		if err != nil {
			return nil, fmt.Errorf("stage %s: layer %s of its chain is missing: %w", m.ID, id, errdefs.ErrFailedPrecondition)
		}
		out = append(out, p)
	}
	return append(out, m), nil
}

// Log returns the chain of the stage ref names.
func (s *Store) Log(ref string) ([]store.Meta, error) {
	m, err := s.Resolve(ref)
	if err != nil {
		return nil, err
	}
	return s.Chain(m)
}

// Remove deletes the stage ref names unless another stage's chain uses it.
func (s *Store) Remove(ctx context.Context, ref string) (store.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := store.Match(ref, s.list())
	if err != nil {
		return store.Meta{}, err
	}
	if m.IsBase() {
		return store.Meta{}, fmt.Errorf("%q is the built-in empty stage and cannot be removed: %w", store.BaseRef, errdefs.ErrInvalidArgument)
	}
	var users []string
	for _, o := range s.stages {
		if o.ID != m.ID && slices.Contains(o.Chain, m.ID) {
			users = append(users, o.String())
		}
	}
	if len(users) > 0 {
		sort.Strings(users)
		return store.Meta{}, fmt.Errorf("stage %s is a layer of %s; remove those first, leaf first: %w",
			m, strings.Join(users, ", "), errdefs.ErrFailedPrecondition)
	}
	if err := os.Remove(s.LayerPath(m.ID)); err != nil {
		return store.Meta{}, fmt.Errorf("removing stage %s: %w", m.ID, err)
	}
	delete(s.stages, m.ID)
	delete(s.blobs, m.ID)
	return m, nil
}

// GC removes the temporary directories nobody holds: one process uses a
// fake store, so there is no age to wait for.
func (s *Store) GC(ctx context.Context) ([]string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("listing fake stages: %w", err)
	}
	var removed []string
	for _, e := range ents {
		if !strings.HasPrefix(e.Name(), tmpPrefix) || s.inUse[e.Name()] {
			continue
		}
		if err := os.RemoveAll(filepath.Join(s.dir, e.Name())); err != nil {
			return removed, err
		}
		removed = append(removed, e.Name())
	}
	return removed, nil
}

// Interrupt leaves in the store what a commit stopped before it published
// leaves: a temporary directory with a partial layer that nobody holds.
// It returns its name, which GC reports when it removes it.
func (s *Store) Interrupt() (string, error) {
	dir, err := os.MkdirTemp(s.dir, tmpPrefix+"st-")
	if err != nil {
		return "", err
	}
	return filepath.Base(dir), os.WriteFile(filepath.Join(dir, "layer.ext4"), []byte("partial"), 0o600)
}

// TempDir makes a directory for layers in transit that GC leaves alone
// until release removes it.
func (s *Store) TempDir() (string, func(), error) {
	dir, err := os.MkdirTemp(s.dir, tmpPrefix+"xfer-")
	if err != nil {
		return "", nil, fmt.Errorf("creating a transfer directory: %w", err)
	}
	name := filepath.Base(dir)
	s.mu.Lock()
	s.inUse[name] = true
	s.mu.Unlock()
	return dir, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		os.RemoveAll(dir)
		delete(s.inUse, name)
	}, nil
}

// LayerDigest returns m's full digest.
func (s *Store) LayerDigest(ctx context.Context, m store.Meta) (string, error) {
	if m.Digest != "" {
		return m.Digest, nil
	}
	_, d, _, err := store.HashLayer(ctx, s.LayerPath(m.ID), m.Parent, m.BaseFlavor)
	return d, err
}

// EncodeLayer writes stage id's layer as a sparse layer stream.
func (s *Store) EncodeLayer(ctx context.Context, id string, w io.Writer) error {
	if err := store.EncodeFile(ctx, s.LayerPath(id), w); err != nil {
		return fmt.Errorf("stage %s: %w", id, err)
	}
	return nil
}

// BlobRecord returns stage id's blob record, if it has one.
func (s *Store) BlobRecord(id string) (store.BlobRecord, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.blobs[id]
	return r, ok
}

// SetBlobRecord records how stage id's layer was packed.
func (s *Store) SetBlobRecord(id string, r store.BlobRecord) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.stages[id]; !ok {
		return fmt.Errorf("recording the blob of stage %s: %w", id, errdefs.ErrNotFound)
	}
	s.blobs[id] = r
	return nil
}
