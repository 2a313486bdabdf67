package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
)

// makeReady restores a VM of sp's shape from its snapshot, paused, with
// its disks backed and its NIC's socket parked, in place (which a failure
// releases). It gets a VM directory and record like a run, so that `isopod
// vm gc` finds its VMM should this process die.
func (s *Service) makeReady(ctx context.Context, sp readySpec, place *admission.Ticket) (_ *readyVM, retErr error) {
	r, err := s.restorer(ctx)
	if err != nil {
		return nil, err
	}
	meta, err := s.warm.Read(sp.shape.key)
	if err != nil {
		return nil, err
	}
	d, err := s.newVMDir([]string{"isopod", "ready"}, sp.base, "")
	if err != nil {
		return nil, err
	}
	rv := &readyVM{shape: sp.shape, buildID: meta.BuildID, dir: d, vm: machine.New(s.log), vmmInfo: meta.VMM, place: place}
	defer func() {
		if retErr != nil {
			rv.discard()
		}
	}()
	rv.scratch = filepath.Join(d.path, "scratch.ext4")
	if err := s.prepareScratch(rv.scratch, sp.shape.scratchMiB); err != nil {
		return nil, err
	}
	ph, err := machine.Placeholders(d.path)
	if err != nil {
		return nil, err
	}
	var net *vmm.Net
	if sp.in.key.NIC {
		if rv.nic, err = machine.ParkNIC(s.opts.Paths.Scope(), d.rec.ID); err != nil {
			return nil, err
		}
		net = rv.nic.VMMNet()
	}
	// The layers' identities, taken before QEMU opens them: a file
	// replaced in between makes the VM stale, never a wrong match.
	for _, l := range sp.layers {
		fi, err := os.Stat(l)
		if err != nil {
			return nil, fmt.Errorf("a layer of a ready VM: %w", err)
		}
		rv.layerPaths, rv.layers = append(rv.layerPaths, l), append(rv.layers, fi)
	}
	disks := machine.Disks{Base: sp.in.base.Path, Layers: sp.layers, Scratch: rv.scratch}.Slots(ph)
	cfg := warmConfig(sp.in, d.rec.ID, d.path, d.serial, net, disks)
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
	rv.vm.Attach(m)
	d.started(m)
	rv.made = time.Now()
	return rv, nil
}

// adoptReady makes the claimed ready VM the run's: its directory, record,
// scratch disk and VMM.
func (r *run) adoptReady() {
	rv := r.ready
	d := rv.dir
	d.rec.Argv, d.rec.Stage = r.req.Argv, r.req.Stage
	writeRecord(d.path, d.rec)
	r.dir, r.scratch, r.vm = d, rv.scratch, rv.vm
	// The run holds its own place (the front end admitted it).
	rv.place.Release()
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
	r.rep.Accel, r.rep.VMM = m.Accel(), rv.vmmInfo
	if err := r.greetResumed(ctx, rctx, rv.shape.key, t); err != nil {
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
	r.s.log.Warn("ready VM unusable; resuming another", "vm", r.dir.rec.ID, "err", err)
	r.ready = nil
	return false, nil
}

// cleanDisks removes a VM's scratch disk and slot placeholders.
func cleanDisks(dir, scratch string) {
	if scratch != "" {
		os.Remove(scratch)
	}
	for _, f := range machine.PlaceholderNames {
		os.Remove(filepath.Join(dir, f))
	}
}
