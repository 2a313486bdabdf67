package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
	"isopod/internal/vmrecord"
)

// Ready VMs (machine.Pool), for a front end that lives long (the MCP
// server): the pool keeps, hands out and ends them; the core decides what
// a run's shape is and makes a VM of it. Runs with a workspace never use
// one (their disks are only known at the call).

// readySpecFor is the shape a run would claim, ok false when it cannot
// use a ready VM.
func (r *run) readySpecFor() (machine.ReadySpec, bool) {
	if r.warm == nil || r.req.Workspace != nil {
		return machine.ReadySpec{}, false
	}
	in, layers, base := r.warm.in, r.plan.layers, r.plan.base.Flavor
	sh := machine.Shape{Key: in.key.ID(), Layers: strings.Join(layers, "\x00"), ScratchMiB: r.plan.scratchMiB}
	s := r.s
	return machine.ReadySpec{Shape: sh, Layers: layers, MemMiB: in.key.MemMiB,
		Make: func(ctx context.Context, place *admission.Ticket) (*machine.Ready, error) {
			return s.makeReady(ctx, sh, in, layers, base, place)
		}}, true
}

// makeReady restores a VM of shape sh from its snapshot, paused, with
// its disks backed and its NIC's socket parked, in place (which a failure
// releases). It gets a VM directory and record like a run, so that `isopod
// vm gc` finds its VMM should this process die.
func (s *Service) makeReady(ctx context.Context, sh machine.Shape, in warmInputs, layers []string, base string, place *admission.Ticket) (_ *machine.Ready, retErr error) {
	r, err := s.restorer(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := s.warm.Read(sh.Key)
	if err != nil {
		return nil, err
	}
	d, err := vmrecord.NewDir(s.opts.Paths, []string{"isopod", "ready"}, base, "")
	if err != nil {
		return nil, err
	}
	rv := &machine.Ready{Shape: sh, BuildID: meta.BuildID, Dir: d, VM: machine.New(s.log), VMM: meta.VMM, Place: place}
	defer func() {
		if retErr != nil {
			rv.Discard()
		}
	}()
	rv.Scratch = filepath.Join(d.Path(), "scratch.ext4")
	if err := s.prepareScratch(rv.Scratch, sh.ScratchMiB); err != nil {
		return nil, err
	}
	ph, err := machine.Placeholders(d.Path())
	if err != nil {
		return nil, err
	}
	var net *vmm.Net
	if in.key.NIC {
		if rv.NIC, err = vmnet.ParkNIC(s.opts.Paths.Scope(), d.Rec.ID); err != nil {
			return nil, err
		}
		net = rv.NIC.VMMNet()
	}
	if err := rv.NoteLayers(layers); err != nil {
		return nil, err
	}
	disks := machine.Disks{Base: in.base.Path, Layers: layers, Scratch: rv.Scratch}.Slots(ph)
	cfg := warmConfig(in, d.Rec.ID, d.Path(), d.Serial, net, disks)
	cfg.Logger, cfg.Paused = s.log, true
	unuse, err := s.warm.Use(ctx, meta.Key)
	if err != nil {
		return nil, err
	}
	m, err := r.Restore(ctx, cfg, s.warm.Dir(meta.Key))
	unuse()
	if err != nil {
		return nil, fmt.Errorf("restoring a ready VM: %w", err)
	}
	rv.VM.Attach(m)
	d.Started(m)
	rv.Made = time.Now()
	return rv, nil
}

// adoptReady makes the claimed ready VM the run's: its directory, record,
// scratch disk and VMM.
func (r *run) adoptReady() {
	rv := r.ready
	d := rv.Dir.(*vmrecord.Dir) // made by makeReady
	d.Rec.Argv, d.Rec.Stage = r.req.Argv, r.req.Stage
	d.Save()
	r.dir, r.scratch, r.vm = d, rv.Scratch, rv.VM
	// The run holds its own place (the front end admitted it).
	rv.Place.Release()
}

// resumeReady lets the claimed ready VM run and makes it the run's root.
// A failure the ready VM may cause is wrapped in errWarmUnusable, with its
// VMM gone: the run then resumes or boots another.
func (r *run) resumeReady(ctx context.Context) error {
	rv := r.ready
	m, _ := r.vm.Current()
	rctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	t := time.Now()
	if err := r.vm.Unpause(rctx); err != nil {
		if ctx.Err() != nil && !errors.Is(err, errdefs.ErrNotSupported) {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", errWarmUnusable, err)
	}
	r.rep.Accel, r.rep.VMM = m.Accel(), rv.VMM
	if err := r.greetResumed(ctx, rctx, rv.Shape.Key, t); err != nil {
		return err
	}
	r.rep.ReadyVM = true
	return nil
}

// bootReady is boot's path for a run that claimed a ready VM; done is
// false when the run must resume or boot another VM instead.
func (r *run) bootReady(ctx context.Context) (done bool, err error) {
	err = r.resumeReady(ctx)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, errWarmUnusable) {
		return false, err
	}
	r.s.log.Warn("ready VM unusable; resuming another", "vm", r.dir.Rec.ID, "err", err)
	r.ready = nil
	return false, nil
}

// StageRemoved ends the ready VMs holding a removed stage's layer now,
// not at the next run: the stage store calls it (stages.Options.Removed).
func (s *Service) StageRemoved() { s.ready.Refill() }
