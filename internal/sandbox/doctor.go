package sandbox

import (
	"context"
	"fmt"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// What `isopod doctor` (internal/doctor) learns from the core.

// Prober returns what the doctor asks the VMM driver about this host
// (vmm.Prober): the Service's driver, or, where its jail cannot be had
// (the doctor's jail check says why), the same driver unconfined.
func (s *Service) Prober(ctx context.Context) (vmm.Prober, error) {
	d, err := s.driver(ctx)
	if err != nil && s.opts.Driver == nil {
		d, err = s.newDriver(nil)
	}
	if err != nil {
		return nil, err
	}
	p, ok := d.(vmm.Prober)
	if !ok {
		info, _ := d.Info(ctx)
		return nil, fmt.Errorf("the VMM driver %s cannot say how it would run guests here: %w", info.Name, errdefs.ErrNotSupported)
	}
	return p, nil
}
