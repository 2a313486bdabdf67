package sandbox

import (
	"isopod/internal/store"
)

// CommitTarget is where a commit of the held VM's filesystem (its scratch
// disk) goes, and the request a run's commit of the same VM would make:
// the same layer format and content ids, its stage as the parent, the
// same base checks. The caller adds the label.
func (h *Held) CommitTarget() (*store.Store, store.CommitRequest, error) {
	r := h.r
	st, err := r.s.store.Open()
	if err != nil {
		return nil, store.CommitRequest{}, err
	}
	creq := store.CommitRequest{Scratch: r.scratch, BaseFlavor: r.plan.base.Flavor, BaseSHA256: r.plan.base.SHA256,
		Argv: r.req.Argv, AllowBaseSkew: r.s.opts.AllowBaseSkew}
	if r.plan.stage != nil {
		creq.Parent = r.plan.stage.ID
	}
	return st, creq, nil
}
