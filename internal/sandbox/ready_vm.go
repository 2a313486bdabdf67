package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"isopod/internal/admission"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
	"isopod/internal/vmrecord"
)

// Ready VMs (machine.Pool), for a front end that lives long (the MCP
// server): the pool keeps, hands out and ends them; the core decides what
// a run's shape is and makes a VM of it. Runs with a workspace never use
// one (their disks are only known at the call).
//
// A ready VM has run: restored from its shape's snapshot and let run, it
// got entropy, a clock and a hostname of its own, assembled its root from
// its disks (the run's layers, a fresh scratch disk) and warmed up
// (machine.Machine.WarmUp). A claim makes it the run's own (fresh entropy
// with a CRNG reseed, the clock, the hostname, the run's network and a
// boot id of its own) and runs the command.

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

// makeReady restores a VM of shape sh from its snapshot, with its disks
// backed and its NIC's socket parked, and warms it up (machine.Machine.WarmUp), in place
// (which a failure releases). It gets a VM directory and record like a
// run, so that `isopod vm gc` finds its VMM should this process die.
func (s *Service) makeReady(ctx context.Context, sh machine.Shape, in warmInputs, layers []string, base string, place *admission.Ticket) (_ *machine.Ready, retErr error) {
	r, err := s.restorer(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := s.warm.Read(sh.Key)
	if err != nil {
		return nil, err
	}
	// Its record reads "isopod warming" until it waits for a claim, then
	// "isopod ready".
	d, err := vmrecord.NewDir(s.opts.Paths, []string{"isopod", "warming"}, base, "")
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
	cfg.Logger = s.log
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
	if err := rv.VM.WarmUp(ctx, d.Rec.Name, machine.Disks{Base: in.base.Path, Layers: layers, Scratch: rv.Scratch}); err != nil {
		return nil, err
	}
	d.Rec.Argv = []string{"isopod", "ready"}
	d.Save()
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

// claimReady makes the claimed ready VM, running with its root
// assembled, the run's own machine: fresh entropy with a CRNG reseed, the
// clock, the hostname, the run's network and a boot id of its own (the
// guest ran before the claim). A failure the ready VM may cause is
// wrapped in errWarmUnusable, with its VMM gone: the run then resumes or
// boots another.
func (r *run) claimReady(ctx context.Context) error {
	rv := r.ready
	m, _ := r.vm.Current()
	rctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	t := time.Now()
	ip, err := r.vm.MakeOwnBoot(rctx, r.dir.Rec.Name, machine.NewBootID())
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.vm.Drop()
		return unusable(err)
	}
	r.s.warm.Used(rv.Shape.Key)
	ms := time.Since(t).Milliseconds()
	r.rep.Accel, r.rep.VMM, r.rep.GuestIP, r.rep.ResumeMS = m.Accel(), rv.VMM, ip, &ms
	r.rep.Path, r.resumed, r.rep.ReadyVM = "warm", true, true
	return nil
}

// bootReady is boot's path for a run that claimed a ready VM; done is
// false when the run must resume or boot another VM instead.
func (r *run) bootReady(ctx context.Context) (done bool, err error) {
	err = r.claimReady(ctx)
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
