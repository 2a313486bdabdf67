package cli

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/admission"
	"isopod/internal/ledger"
	"isopod/internal/sandbox"
)

// place takes a VM place for one of this process's VMs (a run's, a
// session's) in the state root's ledger, against the host-wide limits
// (ISOPOD_MAX_VMS, ISOPOD_MEMORY_BUDGET_MIB), shared with every other
// isopod process. While other processes hold the places it waits, saying
// so on stderr, at most bound, and then fails as busy (unavailable).
// The place is given back by release, or at the latest once the VM's
// cleanup is done as the process exits (Main).
func (e *env) place(ctx context.Context, kind ledger.Kind, id string, memMiB int, bound time.Duration) (release func(), err error) {
	svc, err := e.service()
	if err != nil {
		return nil, err
	}
	label := "isopod " + string(kind)
	if id != "" {
		label += " " + id
	}
	l, err := e.settings.Ledger(label)
	if err != nil {
		return nil, err
	}
	cfg := e.settings.Admission(svc.AccelGuess(ctx))
	cfg.Ledger, cfg.CallKind, cfg.CallID, cfg.Queue = l, kind, id, 1
	a, err := admission.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("VM places: %w", err)
	}
	t, err := a.Reserve(sandbox.Request{MemMiB: memMiB}.WithDefaults().MemMiB)
	if err != nil {
		return nil, fmt.Errorf("taking a VM place: %w", err)
	}
	if s, _, _ := t.Status(); s == admission.TicketQueued {
		e.log.Info("waiting for a VM place", "held", a.HeldText(), "wait_max_s", int(bound.Seconds()))
	}
	if err := t.WaitBounded(ctx, bound); err != nil {
		return nil, fmt.Errorf("waiting for a VM place: %w", err)
	}
	e.places = append(e.places, t.Release)
	return t.Release, nil
}

// releasePlaces gives back every place this process holds.
func (e *env) releasePlaces() {
	for _, r := range e.places {
		r()
	}
}
