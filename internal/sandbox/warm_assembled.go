package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// Assembled snapshots. A shape that recurs (the same base, sizes and
// network, the same stage chain, the default scratch size, no workspace)
// gets a snapshot of a VM whose root is already assembled from that
// chain's layers and a scratch disk: a run of it resumes, is made its own
// (MakeOwn) and executes, with no Mount after the resume. The snapshot
// keeps its scratch image as it was at the snapshot (ScratchFile); each
// clone writes to a copy of its own (a reflink where the file system
// allows, else a sparse copy of a small, mostly empty ext4), attached at
// the scratch slot, so clones never see each other's writes and the
// snapshot's image never changes. The base and the layers are the same
// files at the same slots: layers are content-addressed, and the key names
// them by stage id.
//
// The build is the plain snapshot's (warm_build.go) with the run's disks
// in their slots and the root mounted before the snapshot; nothing in it
// reads the kernel's boot id, so each clone's kernel makes its own. A
// shape's runs are counted in the warm-pool catalog whether or not the
// snapshot exists (warmpool.Catalog.NoteShape): after assembledAfter runs,
// a long-lived front end builds it in the background and the CLI builds it
// inside the next run (within half of what is left of its timeout, as a
// plain snapshot is built), or ahead of time with `isopod warmpool build
// --stage`. Workspaces, other scratch sizes and sessions (which want RAM
// of their own) keep to the plain snapshot. A removed stage's assembled
// snapshots go with it (warmpool.Catalog.RetireOrphans).

// assembledAfter is how many runs of a shape make it recur.
const assembledAfter = 2

// buildScratchName is the scratch disk of an assembled snapshot's VM in
// its VM directory, moved into the snapshot once it is taken.
const buildScratchName = "snapshot-scratch.ext4"

// rootInputs are the inputs of the assembled snapshot of in's shape
// with pl's chain and scratch size.
func rootInputs(in warmInputs, pl *plan) warmInputs {
	ids := make([]string, len(pl.chain))
	for i, st := range pl.chain {
		ids[i] = st.ID
	}
	in.key = in.key.WithRoot(ids, pl.scratchMiB)
	in.layers = append([]string(nil), pl.layers...)
	return in
}

// rootEligible says whether a run of req on pl may use an assembled
// snapshot: no workspace and the default scratch size.
func rootEligible(req Request, pl *plan) bool {
	return req.Workspace == nil && pl.scratchMiB == DefaultScratchMiB
}

// bootAssembled resumes the run from its shape's assembled snapshot,
// counting the run and building the snapshot when the shape recurs (see
// above). done is false when the run must resume from the plain snapshot
// or boot instead.
func (r *run) bootAssembled(ctx context.Context, drv vmm.Driver) (done bool, err error) {
	w := r.warm
	if w.root == nil || r.ownRAM {
		return false, nil
	}
	in := *w.root
	key := in.key.ID()
	before := r.s.warm.NoteShape(key)
	if w.rootMeta == nil {
		w.rootMeta, _ = r.s.warm.Read(key)
	}
	if w.rootMeta == nil {
		switch {
		case r.s.opts.BackgroundSnapshots:
			if before+1 >= assembledAfter {
				r.s.buildInBackground(drv, in)
			}
			return false, nil
		case before < assembledAfter:
			return false, nil
		}
		meta, ranOn, err := r.buildAssembled(ctx, drv, in)
		if meta == nil || err != nil || ranOn {
			return ranOn, err
		}
		w.rootMeta = meta
	}
	meta := w.rootMeta
	err = r.resumeAssembled(ctx, drv, meta)
	if err == nil || !errors.Is(err, errWarmUnusable) {
		return err == nil, err
	}
	if !errors.Is(err, errdefs.ErrNotFound) {
		r.s.warm.Retire(key, meta.BuildID)
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf(
			"the assembled warm-pool snapshot %s could not be resumed (%v); it was removed and this run resumed another way", key, unusableCause(err)))
		r.s.log.Warn("warm pool: unusable assembled snapshot retired", "key", key, "err", err)
	}
	return false, nil
}

// buildAssembled builds in's assembled snapshot inside the run, as
// buildInline builds a plain one (half of what is left of the run's
// timeout), unless another builder holds it or the time is too short: the
// run then does without, silently, since it resumes from the plain
// snapshot instead. The snapshot's VM runs on as the run's (ranOn), its
// root assembled: one more clone of the snapshot, made its own as every
// clone is (configure), which saves the run a restore and the first
// translation of the guest's paths that a fresh VMM makes.
func (r *run) buildAssembled(ctx context.Context, drv vmm.Driver, in warmInputs) (_ *warmpool.Meta, ranOn bool, _ error) {
	budget := min(snapshotBuildTimeout, time.Until(r.deadline())/2)
	if budget < inlineBuildMin {
		return nil, false, nil
	}
	unlock, ok := r.s.warm.TryBuild(in.key.ID())
	if !ok {
		return nil, false, nil
	}
	defer unlock()
	if meta, err := r.s.warm.Read(in.key.ID()); err == nil {
		return meta, false, nil
	}
	deadline := time.Now().Add(budget)
	meta, start, err := r.s.buildWarm(ctx, drv, in, warmBuild{dir: r.dir, vm: r.vm, deadline: deadline, runOn: true,
		started: func(m vmm.Machine) { r.rep.Accel = m.Accel() }})
	switch {
	case err == nil:
		r.rep.SnapshotBuilt = true
		r.rep.SnapshotBuildMS = &meta.BuildMS
		if start.runsOn {
			r.ranOn(start, filepath.Join(r.dir.Path(), buildScratchName), true)
		}
		return meta, start.runsOn, nil
	case ctx.Err() != nil:
		return nil, false, ctx.Err()
	}
	r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("building the warm-pool snapshot of this shape with its root assembled failed "+
		"(%v); this run resumed or booted as before", err))
	return nil, false, nil
}

// resumeAssembled gives the run a copy of the snapshot's scratch image and
// resumes it from meta, whose root is assembled. On a failure the copy is
// removed, for the run to make a fresh scratch disk.
func (r *run) resumeAssembled(ctx context.Context, drv vmm.Driver, meta *warmpool.Meta) error {
	scratch := filepath.Join(r.dir.Path(), "scratch.ext4")
	if err := image.CopySparse(scratch, filepath.Join(r.s.warm.Dir(meta.Key), warmpool.ScratchFile)); err != nil {
		// Retired only if it is still the build tried (bootAssembled).
		return unusable(fmt.Errorf("the snapshot's scratch disk: %w", err))
	}
	r.scratch = scratch
	if err := r.resume(ctx, drv, meta); err != nil {
		os.Remove(scratch)
		r.scratch = ""
		return err
	}
	r.rootAssembled = true
	r.rep.RootAssembled = true
	r.s.warm.Touch(r.warm.in.key.ID())
	return nil
}
