package sandbox

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/admission"
	"isopod/internal/image"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmrecord"
)

// What the benchmarks (internal/bench) measure isopod against: the same
// VMM, started directly, with the same inputs as a run but none of the run
// around it.

// Driver returns the VMM driver runs use.
func (s *Service) Driver(ctx context.Context) (vmm.Driver, error) { return s.driver(ctx) }

// Boot is the guest kernel and initramfs runs boot.
func (s *Service) Boot() (image.Boot, error) { return s.resolveBoot() }

// RestoreFloor is what a warm run of the defaults restores: the snapshot
// directory and a VM configuration with a network of its own (close ends
// it). The snapshot must exist (see WarmBuild). dir must exist.
func (s *Service) RestoreFloor(ctx context.Context, dir string) (snapshot string, cfg vmm.Config, close func(), err error) {
	req, err := normalize(Request{Argv: []string{"true"}}, admission.ReadHost())
	if err != nil {
		return "", vmm.Config{}, nil, err
	}
	pl, err := s.planRun(ctx, req)
	if err != nil {
		return "", vmm.Config{}, nil, err
	}
	in, err := s.warmKeyFor(ctx, pl.base, req.VCPUs, req.MemMiB, true)
	if err != nil {
		return "", vmm.Config{}, nil, err
	}
	if _, err := s.warm.Read(in.key.ID()); err != nil {
		return "", vmm.Config{}, nil, fmt.Errorf("bench: no snapshot for %s: %w", in.key.ID(), err)
	}
	id := "floor-" + vmrecord.NewID()[3:]
	n, err := s.startNetwork(nil, id, dir, req.rules, time.Now())
	if err != nil {
		return "", vmm.Config{}, nil, err
	}
	ph, err := machine.Placeholders(dir)
	if err != nil {
		n.Close()
		return "", vmm.Config{}, nil, err
	}
	cfg = warmConfig(in, id, dir, nil, n.VMMNet(), machine.Disks{Base: pl.base.Path}.Slots(ph))
	cfg.Logger = s.log
	return s.warm.Dir(in.key.ID()), cfg, n.Close, nil
}
