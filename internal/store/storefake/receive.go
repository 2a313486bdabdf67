package storefake

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// Receive publishes a received layer as a stage under the id its bytes
// hash to, which must be the one the sender gave; a stage already present
// is returned as it is. The parent must be present, over the same base
// flavor.
func (s *Store) Receive(ctx context.Context, req store.ReceiveRequest) (store.Meta, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if m, ok := s.stages[req.ID]; ok {
		return clone(m), nil
	}
	chain, err := s.receivedChain(req)
	if err != nil {
		return store.Meta{}, err
	}
	id, digest, size, err := store.HashLayer(ctx, req.Layer, req.Parent, req.BaseFlavor)
	if err != nil {
		return store.Meta{}, err
	}
	if id != req.ID || digest != req.Digest {
		return store.Meta{}, fmt.Errorf("a received layer hashes to %s (%s), but was sent as %s (%s): %w",
			id, digest, req.ID, req.Digest, errdefs.ErrFailedPrecondition)
	}
	label, err := s.receivedLabel(req)
	if err != nil {
		return store.Meta{}, err
	}
	if err := publish(req.Layer, s.LayerPath(id)); err != nil {
		return store.Meta{}, err
	}
	created := req.Created.UTC()
	if created.IsZero() {
		created = time.Now().UTC()
	}
	m := store.Meta{
		ID: id, Name: s.name(id, label), Label: label, Parent: req.Parent, Chain: chain,
		BaseFlavor: req.BaseFlavor, BaseSHA256: req.BaseSHA256, Digest: digest, SizeBytes: size,
		AllocatedBytes: allocated(s.LayerPath(id)), Created: created, CreatedUnix: created.Unix(),
		Argv: append([]string{}, req.Argv...), IsopodVersion: req.IsopodVersion,
	}
	s.stages[id] = m
	if req.Blob.Digest != "" {
		s.blobs[id] = req.Blob
	}
	return clone(m), nil
}

// receivedChain returns the chain of a received stage; the caller holds
// s.mu.
func (s *Store) receivedChain(req store.ReceiveRequest) ([]string, error) {
	if req.Parent == "" {
		return []string{req.ID}, nil
	}
	parent, ok := s.stages[req.Parent]
	switch {
	case !ok:
		return nil, fmt.Errorf("receiving stage %s: its parent %s: %w", req.ID, req.Parent, errdefs.ErrNotFound)
	case parent.BaseFlavor != req.BaseFlavor:
		return nil, fmt.Errorf("stage %s was made over base flavor %q but its parent %s over %q: %w",
			req.ID, req.BaseFlavor, parent, parent.BaseFlavor, errdefs.ErrInvalidArgument)
	case len(parent.Chain)+1 > store.MaxChainDepth:
		return nil, fmt.Errorf("stage %s would make a chain of %d layers; the limit is %d: %w",
			req.ID, len(parent.Chain)+1, store.MaxChainDepth, errdefs.ErrInvalidArgument)
	}
	return append(append([]string(nil), parent.Chain...), req.ID), nil
}

// receivedLabel returns the label a received stage gets: the one sent, or
// with LabelFallback, label@id when that is taken; the caller holds s.mu.
func (s *Store) receivedLabel(req store.ReceiveRequest) (string, error) {
	if err := store.ValidateLabel(req.Label); err != nil {
		return "", err
	}
	err := s.labelFree(req.Label, req.ID)
	if err == nil || !req.LabelFallback {
		return req.Label, err
	}
	label := req.Label + "@" + req.ID
	if err := store.ValidateLabel(label); err != nil {
		return "", err
	}
	return label, s.labelFree(label, req.ID)
}
