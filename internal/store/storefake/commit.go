package storefake

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// CheckCommit checks, without copying anything, that req could be
// committed now.
func (s *Store) CheckCommit(req store.CommitRequest) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.checkCommit(req); err != nil {
		return err
	}
	return s.labelFree(req.Label, "")
}

// checkCommit validates req and returns the new stage's chain less
// itself; the caller holds s.mu.
func (s *Store) checkCommit(req store.CommitRequest) ([]string, error) {
	if err := store.ValidateLabel(req.Label); err != nil {
		return nil, err
	}
	switch {
	case req.Scratch == "":
		return nil, fmt.Errorf("commit: no scratch layer given: %w", errdefs.ErrInvalidArgument)
	case req.BaseFlavor == "":
		return nil, fmt.Errorf("commit: no base flavor given: %w", errdefs.ErrInvalidArgument)
	case req.Parent == "":
		return nil, nil
	case !store.IDPattern.MatchString(req.Parent):
		return nil, fmt.Errorf("commit parent %q: want a stage id: %w", req.Parent, errdefs.ErrInvalidArgument)
	}
	parent, err := s.get(req.Parent)
	if err != nil {
		return nil, fmt.Errorf("commit parent: %w", err)
	}
	chain, err := s.chain(parent)
	if err != nil {
		return nil, err
	}
	if len(chain)+1 > store.MaxChainDepth {
		return nil, fmt.Errorf("committing over %s would make a chain of %d layers; the limit is %d: %w",
			parent, len(chain)+1, store.MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	warns, err := store.CheckBase(chain, req.BaseFlavor, req.BaseSHA256, req.AllowBaseSkew)
	if err != nil {
		return nil, err
	}
	for _, w := range warns {
		s.log.Warn(w)
	}
	return parent.Chain, nil
}

// labelFree checks that no stage but selfID has label as its label or
// name; the caller holds s.mu.
func (s *Store) labelFree(label, selfID string) error {
	for _, m := range s.stages {
		if m.ID != selfID && (m.Label == label || m.Name == label) {
			return fmt.Errorf("label %q is taken by stage %s: %w", label, m, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// Commit publishes the scratch layer req.Scratch as an immutable stage,
// with the real store's id, and returns its meta. It holds the store for
// the whole commit: commits of a fake store take turns.
func (s *Store) Commit(ctx context.Context, req store.CommitRequest) (store.Meta, store.CommitTiming, error) {
	start := time.Now()
	var tm store.CommitTiming
	s.mu.Lock()
	defer s.mu.Unlock()
	chain, err := s.checkCommit(req)
	if err != nil {
		return store.Meta{}, tm, err
	}
	id, digest, size, err := store.HashLayer(ctx, req.Scratch, req.Parent, req.BaseFlavor)
	if err != nil {
		return store.Meta{}, tm, err
	}
	tm.HashMS = time.Since(start).Milliseconds()
	if m, ok := s.stages[id]; ok {
		if m.Label != req.Label {
			return store.Meta{}, tm, fmt.Errorf("identical content is already stage %s: %w", m, errdefs.ErrAlreadyExists)
		}
		return clone(m), tm, nil
	}
	if err := s.labelFree(req.Label, id); err != nil {
		return store.Meta{}, tm, err
	}
	t1 := time.Now()
	if err := s.copyLayer(ctx, req.Scratch, id); err != nil {
		return store.Meta{}, tm, err
	}
	tm.CopyMS = time.Since(t1).Milliseconds()
	now := time.Now().UTC()
	m := store.Meta{
		ID: id, Name: s.name(id, req.Label), Label: req.Label, Parent: req.Parent, Chain: append(chain, id),
		BaseFlavor: req.BaseFlavor, BaseSHA256: req.BaseSHA256, Digest: digest, SizeBytes: size,
		Created: now, CreatedUnix: now.Unix(), Argv: append([]string{}, req.Argv...), IsopodVersion: s.version,
	}
	m.AllocatedBytes = allocated(s.LayerPath(id))
	s.stages[id] = m
	tm.TotalMS = time.Since(start).Milliseconds()
	return clone(m), tm, nil
}

// name picks stage id's vanity name apart from every name and label and
// the new label; the caller holds s.mu.
func (s *Store) name(id, label string) string {
	taken := map[string]bool{label: true}
	for _, m := range s.stages {
		taken[m.Name], taken[m.Label] = true, true
	}
	return store.StageName(id, taken)
}

// copyLayer copies scratch sparsely to stage id's read-only layer file,
// through a temporary directory; the caller holds s.mu.
func (s *Store) copyLayer(ctx context.Context, scratch, id string) error {
	tmp, err := os.MkdirTemp(s.dir, tmpPrefix+id+"-")
	if err != nil {
		return fmt.Errorf("creating commit directory: %w", err)
	}
	defer os.RemoveAll(tmp)
	layer := filepath.Join(tmp, "layer")
	if err := copySparse(ctx, scratch, layer); err != nil {
		return fmt.Errorf("copying layer: %w", err)
	}
	return publish(layer, s.LayerPath(id))
}

// publish makes layer read-only and moves it to path.
func publish(layer, path string) error {
	if err := os.Chmod(layer, 0o444); err != nil {
		return fmt.Errorf("making layer read-only: %w", err)
	}
	if err := os.Rename(layer, path); err != nil {
		return fmt.Errorf("publishing layer: %w", err)
	}
	return nil
}

// allocated returns the bytes the file at path occupies; 0 if unknown.
func allocated(path string) int64 {
	st, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Blocks * 512
	}
	return 0
}

// blockSize is the unit of the sparse copy; chunkSize how much it reads
// at a time.
const blockSize, chunkSize = 4096, 1 << 20

// copySparse copies src to a new file dst, leaving holes where src has
// blocks of zeros. It does not fsync: a fake store outlives no crash.
func copySparse(ctx context.Context, src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	defer out.Close()
	buf, zero := make([]byte, chunkSize), make([]byte, blockSize)
	var off int64
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := io.ReadFull(in, buf)
		for b := 0; b < n; b += blockSize {
			blk := buf[b:min(b+blockSize, n)]
			if bytes.Equal(blk, zero[:len(blk)]) {
				continue
			}
			if _, werr := out.WriteAt(blk, off+int64(b)); werr != nil {
				return werr
			}
		}
		off += int64(n)
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return out.Truncate(off)
		}
		if err != nil {
			return err
		}
	}
}
