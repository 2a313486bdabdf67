package sandbox

import (
	"context"
	"fmt"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/store"
)

// stages opens the stage store.
func (s *Service) stages() (*store.Store, error) {
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	return store.Open(s.opts.Paths.Stages(), store.Options{
		LocksDir: s.opts.Paths.Locks(),
		Logger:   s.log,
		Version:  s.opts.Version,
	})
}

func toRef(st *store.Store, m store.Meta) stageRef {
	return stageRef{ID: m.ID, Name: m.Name, Label: m.Label, BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256, Layer: st.LayerPath(m.ID)}
}

// stageChain opens the store and resolves ref to its chain of stages, root
// first; the reserved empty stage has an empty chain.
func (s *Service) stageChain(ref string) (*store.Store, []store.Meta, error) {
	st, err := s.stages()
	if err != nil {
		return nil, nil, err
	}
	m, err := st.Resolve(ref)
	if err != nil {
		return nil, nil, err
	}
	if m.IsBase() {
		return st, nil, nil
	}
	chain, err := st.Chain(m)
	if err != nil {
		return nil, nil, err
	}
	return st, chain, nil
}

// resolveChain resolves ref to its chain of stages, root first.
func (s *Service) resolveChain(ref string) ([]stageRef, error) {
	st, chain, err := s.stageChain(ref)
	if err != nil || len(chain) == 0 {
		return nil, err
	}
	out := make([]stageRef, len(chain))
	for i, c := range chain {
		out[i] = toRef(st, c)
	}
	return out, nil
}

// checkChainBase refuses a chain made over another build of its base.
func (s *Service) checkChainBase(chain []stageRef, base baseImage) ([]string, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	metas := make([]store.Meta, 0, len(chain))
	for _, c := range chain {
		m, err := st.Get(c.ID)
		if err != nil {
			return nil, err
		}
		metas = append(metas, m)
	}
	return store.CheckBase(metas, base.Flavor, base.SHA256, s.opts.AllowBaseSkew)
}

// checkLabelFree refuses a --commit-as label that is already taken, before
// the run, so that a long setup is not wasted. The label's form was checked
// when the request was normalised.
func (s *Service) checkLabelFree(label string) error {
	st, err := s.stages()
	if err != nil {
		return err
	}
	all, err := st.List()
	if err != nil {
		return err
	}
	for _, m := range all {
		if m.Label == label {
			return fmt.Errorf("--commit-as %q: the label is taken by stage %s (%s); pick another label or remove it with `isopod stage rm %s`: %w",
				label, m.ID, m.Name, m.ID, errdefs.ErrAlreadyExists)
		}
	}
	return nil
}

// warnNothingCommitted tells a --commit-as run that ended without a commit.
func (r *run) warnNothingCommitted() {
	if r.req.CommitAs != "" {
		r.rep.Warnings = append(r.rep.Warnings, "nothing committed: --commit-as commits only when the command exits 0")
	}
}

// commit publishes the scratch disk as a stage when the command exited 0.
// A commit that fails is reported in CommitError; the run keeps its report.
func (r *run) commit(ctx context.Context, done *agentproto.ExecDone) {
	if r.req.CommitAs == "" {
		return
	}
	if done.TimedOut || done.ExitCode == nil || *done.ExitCode != 0 {
		r.warnNothingCommitted()
		return
	}
	if err := r.commitScratch(ctx); err != nil {
		r.rep.CommitError = err.Error()
		r.s.log.Warn("commit failed; the run's report is kept", "vm", r.rep.VMID, "err", err)
	}
}

// commitScratch stores the scratch disk as a stage.
func (r *run) commitScratch(ctx context.Context) error {
	st, err := r.s.stages()
	if err != nil {
		return err
	}
	parent := ""
	if r.plan.stage != nil {
		parent = r.plan.stage.ID
	}
	m, tm, err := st.Commit(ctx, store.CommitRequest{
		Scratch:       r.scratch,
		Label:         r.req.CommitAs,
		Parent:        parent,
		BaseFlavor:    r.plan.base.Flavor,
		BaseSHA256:    r.plan.base.SHA256,
		Argv:          r.req.Argv,
		AllowBaseSkew: r.s.opts.AllowBaseSkew,
	})
	if err != nil {
		return fmt.Errorf("committing the stage: %w", err)
	}
	r.rep.StageID, r.rep.StageName = m.ID, m.Name
	total, hash, cp := tm.TotalMS, tm.HashMS, tm.CopyMS
	r.rep.CommitMS, r.rep.CommitHashMS, r.rep.CommitCopyMS = &total, &hash, &cp
	return nil
}
