package sandbox

import (
	"context"
	"fmt"
	"time"

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

func stageEntry(m store.Meta) StageEntry {
	return StageEntry{
		ID: m.ID, Name: m.Name, Label: m.Label, Parent: m.Parent, Chain: m.Chain,
		BaseFlavor: m.BaseFlavor, BaseSHA256: m.BaseSHA256,
		SizeBytes: m.SizeBytes, Allocated: m.AllocatedBytes,
		Created: m.Created.UTC().Format(time.RFC3339), Argv: m.Argv,
	}
}

// stageEntries describes ms in order; never nil.
func stageEntries(ms []store.Meta) []StageEntry {
	out := make([]StageEntry, 0, len(ms))
	for _, m := range ms {
		out = append(out, stageEntry(m))
	}
	return out
}

// staleness marks entries whose chain disagrees with the installed base.
func (s *Service) markStale(st *store.Store, entries []StageEntry) {
	shas := map[string]string{}
	for i := range entries {
		flavor := entries[i].BaseFlavor
		sha, ok := shas[flavor]
		if !ok {
			if b, err := s.lookupBase(flavor); err == nil {
				sha = b.SHA256
			}
			shas[flavor] = sha
		}
		if sha == "" {
			continue
		}
		for _, id := range entries[i].Chain {
			m, err := st.Get(id)
			if err == nil && m.BaseSHA256 != "" && m.BaseSHA256 != sha && !s.haveBaseBuild(m.BaseSHA256) {
				entries[i].Stale = true
			}
		}
	}
}

// StageList lists stages oldest first.
func (s *Service) StageList(ctx context.Context) (*StageListResult, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	all, err := st.List()
	if err != nil {
		return nil, err
	}
	res := &StageListResult{OK: true, Stages: stageEntries(all)}
	s.markStale(st, res.Stages)
	return res, nil
}

// StageInfo resolves ref and describes the stage and its chain.
func (s *Service) StageInfo(ctx context.Context, ref string) (*StageInfoResult, error) {
	st, chain, err := s.stageChain(ref)
	if err != nil {
		return nil, err
	}
	if len(chain) == 0 {
		return nil, fmt.Errorf("%q is the reserved empty stage: it has no layers: %w", ref, errdefs.ErrInvalidArgument)
	}
	res := &StageInfoResult{OK: true, Chain: stageEntries(chain)}
	for _, c := range chain {
		res.LayerPaths = append(res.LayerPaths, st.LayerPath(c.ID))
	}
	s.markStale(st, res.Chain)
	res.Stage = res.Chain[len(res.Chain)-1]
	return res, nil
}

// StageRemove removes a stage no other stage builds on.
func (s *Service) StageRemove(ctx context.Context, ref string) (*StageRemoveResult, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	m, err := st.Remove(ctx, ref)
	if err != nil {
		return nil, err
	}
	// A ready VM holding the removed layer ends now, not at the next run.
	s.ready.Refill()
	return &StageRemoveResult{OK: true, Removed: m.ID, Label: m.Label, Name: m.Name}, nil
}

// StageLogResult is the chain from the base to a stage.
type StageLogResult struct {
	OK     bool         `json:"ok"`
	Base   string       `json:"base"`
	Layers []StageEntry `json:"layers"` // root first
}

// StageLog lists the chain from the base to ref, each layer with the command
// that produced it, when, and its size.
func (s *Service) StageLog(ctx context.Context, ref string) (*StageLogResult, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	chain, err := st.Log(ref)
	if err != nil {
		return nil, err
	}
	res := &StageLogResult{OK: true, Layers: stageEntries(chain)}
	if n := len(chain); n > 0 {
		res.Base = chain[n-1].BaseFlavor
	}
	return res, nil
}

// StageDiffResult lists what changed from one stage to another.
type StageDiffResult struct {
	OK      bool          `json:"ok"`
	From    string        `json:"from"`
	To      string        `json:"to"`
	Added   []store.Entry `json:"added"`
	Changed []store.Entry `json:"changed"`
	Removed []store.Entry `json:"removed"`
}

// StageDiff compares the merged layers of two stages, read on the host.
func (s *Service) StageDiff(ctx context.Context, a, b string) (*StageDiffResult, error) {
	st, err := s.stages()
	if err != nil {
		return nil, err
	}
	d, err := st.Diff(ctx, a, b)
	if err != nil {
		return nil, err
	}
	nz := func(e []store.Entry) []store.Entry {
		if e == nil {
			return []store.Entry{}
		}
		return e
	}
	return &StageDiffResult{OK: true, From: a, To: b, Added: nz(d.Added), Changed: nz(d.Changed), Removed: nz(d.Removed)}, nil
}
