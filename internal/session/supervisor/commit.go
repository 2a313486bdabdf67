package supervisor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/store"
)

// CommitReport is the answer to a commit call: the stage the session's
// filesystem was stored as, and where the commit's time went.
type CommitReport struct {
	OK        bool   `json:"ok"`
	SessionID string `json:"session_id"`
	HeldCommit
}

// commit stores the session's filesystem as a stage labelled c.Label; the
// session keeps running.
func (s *sup) commit(ctx context.Context, c session.Call) (any, error) {
	hc, err := s.vm.Commit(ctx, c.Label)
	if err != nil {
		return nil, err
	}
	return CommitReport{OK: true, SessionID: s.o.ID, HeldCommit: hc}, nil
}

// A session's filesystem is committed while it runs: the guest freezes the
// scratch filesystem (so that its disk image is clean: no journal to
// replay), the host copies the image into the store's staging area, the
// guest thaws, and the copy is committed exactly as a run's scratch disk
// is after its VM has stopped (store.Commit: the same layer format and
// content ids, the session's stage as the parent, the same base checks).

// freezeBound is how long the guest stays frozen at most: it thaws on its
// own after that even when no thaw comes.
const freezeBound = agentproto.DefaultFreezeMS * time.Millisecond

// thawTimeout bounds the thaw, which runs even when the commit's context
// has ended.
const thawTimeout = 10 * time.Second

// HeldCommit is what a held VM's commit stored, and where its time went,
// in the fields a run's report names the same way.
type HeldCommit struct {
	StageID      string `json:"stage_id"`
	StageName    string `json:"stage_name"`
	CommitMS     int64  `json:"commit_ms"`      // the whole commit, checks to publication
	CommitHashMS int64  `json:"commit_hash_ms"` // hashing the copy (store.Commit)
	CommitCopyMS int64  `json:"commit_copy_ms"` // moving it into the stage and syncing it (0: the stage existed)
	// FrozenMS is from the freeze call to the thaw's answer: at most how
	// long the guest's writes to its filesystem were held. FreezeMS is its
	// freeze call (the guest's sync and freeze).
	FrozenMS int64 `json:"commit_frozen_ms"`
	FreezeMS int64 `json:"commit_freeze_ms"`
	// SnapshotMS is the copy of the disk image while frozen; Reflinked
	// says it shared the disk's blocks instead of copying its data.
	SnapshotMS int64 `json:"commit_snapshot_ms"`
	Reflinked  bool  `json:"commit_reflinked"`
}

// Commit stores the session VM's filesystem (its scratch disk) as a stage
// labelled label; the VM keeps running. A bad or taken label, a missing
// parent stage or a base that disagrees is refused before the guest is
// touched. The guest is thawed whatever happens on the host's side.
func (v *VM) Commit(ctx context.Context, label string) (HeldCommit, error) {
	t0 := time.Now()
	if err := sandbox.CheckLabel("as", label); err != nil {
		return HeldCommit{}, err
	}
	if !v.commitMu.TryLock() {
		return HeldCommit{}, fmt.Errorf("a commit of this VM is in progress; retry when it ends: %w", errdefs.ErrFailedPrecondition)
	}
	defer v.commitMu.Unlock()
	st, creq, err := v.CommitTarget()
	if err != nil {
		return HeldCommit{}, err
	}
	creq.Label = label
	if err := st.CheckCommit(creq); err != nil {
		return HeldCommit{}, err
	}
	sn, hc, err := v.snapshot(ctx, st, creq.Scratch)
	if err != nil {
		return hc, err
	}
	defer sn.Close()
	m, tm, err := st.CommitSnapshot(ctx, sn, creq)
	if err != nil {
		return hc, fmt.Errorf("committing the stage: %w", err)
	}
	hc.StageID, hc.StageName = m.ID, m.Name
	hc.CommitHashMS, hc.CommitCopyMS, hc.CommitMS = tm.HashMS, tm.CopyMS, time.Since(t0).Milliseconds()
	return hc, nil
}

// snapshot copies the scratch disk's image into st's staging area while
// the guest holds its filesystem frozen, and thaws it, even when the copy
// fails or ctx ends.
func (v *VM) snapshot(ctx context.Context, st *store.Store, scratch string) (*store.Snapshot, HeldCommit, error) {
	var hc HeldCommit
	vm := v.Machine()
	t0 := time.Now()
	thaw := func() error {
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), thawTimeout)
		defer cancel()
		return vm.Thaw(tctx)
	}
	// The guest thaws on its own at the bound: past it, neither the
	// freeze's answer nor the copy is worth waiting for.
	fctx, cancel := context.WithDeadline(ctx, t0.Add(freezeBound))
	defer cancel()
	if err := vm.Freeze(fctx, freezeBound); err != nil {
		// The freeze may have taken hold in the guest before the call
		// failed (ctx ended): end it, or it holds until its bound.
		_ = thaw()
		return nil, hc, fmt.Errorf("freezing the guest's filesystem: %w", err)
	}
	t1 := time.Now()
	hc.FreezeMS = t1.Sub(t0).Milliseconds()
	sn, err := st.SnapshotLayer(fctx, scratch)
	if err != nil && ctx.Err() == nil && fctx.Err() != nil {
		err = fmt.Errorf("the copy of the scratch disk took longer than the guest's freeze may last (%s): %w: %w",
			freezeBound, err, errdefs.ErrUnavailable)
	}
	hc.SnapshotMS = time.Since(t1).Milliseconds()
	terr := thaw()
	hc.FrozenMS = time.Since(t0).Milliseconds()
	if err != nil {
		return nil, hc, errors.Join(err, terr)
	}
	if terr != nil {
		sn.Close()
		return nil, hc, fmt.Errorf("thawing the guest's filesystem (the copy is dropped): %w", terr)
	}
	hc.Reflinked = sn.Reflinked
	return sn, hc, nil
}
