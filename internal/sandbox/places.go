package sandbox

import (
	"context"

	"isopod/internal/admission"
	"isopod/internal/vmm"
)

// Places hands background VMs (ready VMs, snapshot builds) their places:
// the core asks for one before such a VM starts and is told, through the
// Yield it gives, to give it back to a call. A long-lived front end's
// *admission.Admission is one.
type Places interface {
	// TryHold takes a place for a background VM of memMiB of guest
	// memory at once or not at all.
	TryHold(memMiB int, y admission.Yield) (*admission.Ticket, bool)
	// Freed returns a channel closed at the next release of a place (or
	// of a place in the queue): the moment to try TryHold again.
	Freed() <-chan struct{}
	// CanHold reports whether a background VM of memMiB could take a
	// place here at all (on an idle host).
	CanHold(memMiB int) bool
}

var _ Places = (*admission.Admission)(nil)

// DefaultAdmission is the admission limits for host h's VMs (its cores
// and memory: admission.ReadHost) under accel (admission.Default), with
// the core's sizes of a run.
func DefaultAdmission(h admission.Host, accel vmm.Accel) admission.Config {
	h.Accel, h.MinMemMiB, h.RunMemMiB = accel, MinMemMiB, DefaultMemMiB
	return admission.Default(h)
}

// AccelGuess is the acceleration a VM would get now, without booting
// one; TCG when it cannot be told.
func (s *Service) AccelGuess(ctx context.Context) vmm.Accel {
	d, err := s.driver(ctx)
	if err != nil {
		return vmm.AccelTCG
	}
	r, ok := d.(vmm.Restorer)
	if !ok {
		return vmm.AccelTCG
	}
	id, err := r.SnapshotIdentity(ctx)
	if err != nil || id.Accel == "" {
		return vmm.AccelTCG
	}
	return id.Accel
}
