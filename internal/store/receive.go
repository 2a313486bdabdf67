package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/errdefs"
)

// What a stage transfer needs of the store: a place for layers in
// transit, the full digest of every layer, a record of how a layer was
// packed for a registry, and publishing a received layer under the id its
// bytes hash to.

const blobFile = "blob.json"

// BlobRecord is how a stage's layer was last packed as a registry blob,
// so that a later push can ask the registry for it without packing it
// again. It is a cache: a wrong one only costs a repack.
type BlobRecord struct {
	Digest    string `json:"digest"` // sha256:...
	Size      int64  `json:"size"`
	MediaType string `json:"media_type"`
}

// BlobRecord returns stage id's blob record, if it has one.
func (s *Store) BlobRecord(id string) (BlobRecord, bool) {
	var r BlobRecord
	b, err := os.ReadFile(filepath.Join(s.dir, id, blobFile))
	if err != nil || json.Unmarshal(b, &r) != nil || r.Digest == "" {
		return BlobRecord{}, false
	}
	return r, true
}

// SetBlobRecord records how stage id's layer was packed.
func (s *Store) SetBlobRecord(id string, r BlobRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	dir := filepath.Join(s.dir, id)
	f, err := os.CreateTemp(dir, ".blob-")
	if err != nil {
		return fmt.Errorf("recording the blob of stage %s: %w", id, err)
	}
	_, werr := f.Write(b)
	cerr := f.Close()
	if err := errors.Join(werr, cerr); err != nil {
		os.Remove(f.Name())
		return err
	}
	if err := os.Rename(f.Name(), filepath.Join(dir, blobFile)); err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("recording the blob of stage %s: %w", id, err)
	}
	return nil
}

// LayerDigest returns m's full digest: the recorded one, or for a stage
// committed before digests were recorded, its layer hashed now.
func (s *Store) LayerDigest(ctx context.Context, m Meta) (string, error) {
	if m.Digest != "" {
		return m.Digest, nil
	}
	_, d, _, err := HashLayer(ctx, s.LayerPath(m.ID), m.Parent, m.BaseFlavor)
	return d, err
}

// TempDir makes a directory in the store for layers in transit. GC leaves
// it alone until release, which removes it.
func (s *Store) TempDir() (dir string, release func(), err error) {
	dir, err = os.MkdirTemp(s.dir, tmpPrefix+"xfer-")
	if err != nil {
		return "", nil, fmt.Errorf("creating a transfer directory: %w", err)
	}
	fl := flock.New(filepath.Join(dir, ".lock"), flock.SetPermissions(0o600))
	if _, err := fl.TryLock(); err != nil {
		os.RemoveAll(dir)
		return "", nil, fmt.Errorf("locking the transfer directory: %w", err)
	}
	return dir, func() {
		os.RemoveAll(dir)
		fl.Close()
	}, nil
}

// ReceiveRequest is a layer that came from elsewhere, with what its
// sender says of it.
type ReceiveRequest struct {
	Layer  string // the layer file, in a directory from TempDir; moved into the store
	ID     string // the stage id the sender gives it
	Digest string // and its full digest
	Label  string
	// LabelFallback: when Label is taken, use Label@ID instead of failing.
	LabelFallback bool
	Parent        string
	BaseFlavor    string
	BaseSHA256    string
	Argv          []string
	Created       time.Time
	IsopodVersion string
	Blob          BlobRecord // how it travelled
}

// Receive publishes a received layer as a stage. The id and full digest
// are computed again from the bytes, with the parent and base flavor, and
// must be the ones the sender gave: a layer is never stored under an id
// it does not hash to. A stage already present is returned as it is.
// The parent must be present and made over the same base flavor (a chain
// keeps one, as Commit requires).
func (s *Store) Receive(ctx context.Context, req ReceiveRequest) (Meta, error) {
	if m, err := s.Get(req.ID); err == nil {
		return m, nil
	}
	if req.Parent != "" {
		if _, err := s.Get(req.Parent); err != nil {
			return Meta{}, fmt.Errorf("receiving stage %s: its parent: %w", req.ID, err)
		}
	}
	id, digest, size, err := HashLayer(ctx, req.Layer, req.Parent, req.BaseFlavor)
	if err != nil {
		return Meta{}, err
	}
	if id != req.ID || digest != req.Digest {
		return Meta{}, fmt.Errorf("a received layer hashes to %s (%s), but was sent as %s (%s): it is not the stage it claims to be: %w",
			id, digest, req.ID, req.Digest, errdefs.ErrFailedPrecondition)
	}
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+id+"-")
	if err != nil {
		return Meta{}, fmt.Errorf("creating stage directory: %w", err)
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	layer := filepath.Join(tmp, layerFile)
	if err := os.Rename(req.Layer, layer); err != nil {
		return Meta{}, fmt.Errorf("moving the received layer: %w", err)
	}
	if err := os.Chmod(layer, 0o444); err != nil {
		return Meta{}, err
	}
	f, err := os.Open(layer)
	if err != nil {
		return Meta{}, err
	}
	allocated, err := allocatedBytes(f)
	f.Close()
	if err != nil {
		return Meta{}, err
	}
	release, err := s.lock(ctx)
	if err != nil {
		return Meta{}, err
	}
	defer release()
	all, err := s.List()
	if err != nil {
		return Meta{}, err
	}
	m, existing, err := s.receiveMeta(all, req, size, allocated)
	if err != nil || existing {
		return m, err
	}
	if err := writeMeta(filepath.Join(tmp, metaFile), m); err != nil {
		return Meta{}, err
	}
	if req.Blob.Digest != "" {
		if b, err := json.Marshal(req.Blob); err == nil {
			os.WriteFile(filepath.Join(tmp, blobFile), b, 0o644)
		}
	}
	if err := syncDir(tmp); err != nil {
		return Meta{}, err
	}
	if err := os.Rename(tmp, filepath.Join(s.dir, id)); err != nil {
		return Meta{}, fmt.Errorf("publishing stage %s: %w", id, err)
	}
	published = true
	return m, syncDir(s.dir)
}

// receiveMeta decides, under the store lock, the meta of a received
// stage; existing says it appeared meanwhile, and m is that stage.
func (s *Store) receiveMeta(all []Meta, req ReceiveRequest, size, allocated int64) (m Meta, existing bool, err error) {
	var parent *Meta
	taken := map[string]bool{}
	for i, m := range all {
		if m.ID == req.ID {
			return m, true, nil
		}
		if m.ID == req.Parent {
			parent = &all[i]
		}
		taken[m.Name], taken[m.Label] = true, true
	}
	chain, err := receivedChain(req, parent)
	if err != nil {
		return Meta{}, false, err
	}
	label := req.Label
	if err := ValidateLabel(label); err != nil {
		return Meta{}, false, err
	}
	if err := labelFree(all, label, req.ID); err != nil {
		if !req.LabelFallback {
			return Meta{}, false, err
		}
		label = req.Label + "@" + req.ID
		if err := ValidateLabel(label); err != nil {
			return Meta{}, false, err
		}
		if err := labelFree(all, label, req.ID); err != nil {
			return Meta{}, false, err
		}
	}
	taken[label] = true
	created := req.Created.UTC()
	if created.IsZero() {
		created = time.Now().UTC()
	}
	return Meta{
		ID: req.ID, Name: StageName(req.ID, taken), Label: label, Parent: req.Parent, Chain: chain,
		BaseFlavor: req.BaseFlavor, BaseSHA256: req.BaseSHA256, Digest: req.Digest,
		SizeBytes: size, AllocatedBytes: allocated, Created: created, CreatedUnix: created.Unix(),
		Argv: append([]string{}, req.Argv...), IsopodVersion: req.IsopodVersion,
	}, false, nil
}

// receivedChain returns the chain of a received stage over parent (nil
// when req has none, or when it is gone): the parent must be present and
// made over the same base flavor, and the chain within MaxChainDepth.
func receivedChain(req ReceiveRequest, parent *Meta) ([]string, error) {
	if req.Parent == "" {
		return []string{req.ID}, nil
	}
	if parent == nil {
		return nil, fmt.Errorf("receiving stage %s: its parent %s: %w", req.ID, req.Parent, errdefs.ErrNotFound)
	}
	if parent.BaseFlavor != req.BaseFlavor {
		return nil, fmt.Errorf("stage %s was made over base flavor %q but its parent %s over %q; a chain keeps one base flavor: %w",
			req.ID, req.BaseFlavor, parent, parent.BaseFlavor, errdefs.ErrInvalidArgument)
	}
	chain := append(append([]string(nil), parent.Chain...), req.ID)
	if len(chain) > MaxChainDepth {
		return nil, fmt.Errorf("stage %s would make a chain of %d layers; the limit is %d: %w", req.ID, len(chain), MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	return chain, nil
}
