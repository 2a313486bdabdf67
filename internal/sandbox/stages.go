package sandbox

import (
	"context"
	"fmt"

	"isopod/internal/agentproto"
	"isopod/internal/store"
)

func toRef(st *store.Store, m store.Meta) stageRef {
	return stageRef{ID: m.ID, Name: m.Name, Label: m.Label, BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256, Layer: st.LayerPath(m.ID)}
}

// resolveChain resolves ref to its chain of stages, root first.
func (s *Service) resolveChain(ref string) ([]stageRef, error) {
	st, chain, err := s.store.Chain(ref)
	if err != nil || len(chain) == 0 {
		return nil, err
	}
	out := make([]stageRef, len(chain))
	for i, c := range chain {
		out[i] = toRef(st, c)
	}
	return out, nil
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
	if err := r.shrinkScratch(); err != nil {
		return err
	}
	st, err := r.s.store.Open()
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
