package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// The warm path of a run. Every run resumes from its shape's snapshot in
// the warm pool (internal/warmpool) instead of booting, once the snapshot
// exists: the first run of a shape builds it.
//
// Layout decision: one snapshot per shape (base build, vCPUs, memory, NIC
// or not), of a VM booted with only its base mounted and every other disk
// slot backed by a placeholder (see machine/disks.go). A resumed QEMU backs the
// slots with the run's layers, its fresh scratch disk and its workspace;
// the guest then assembles its root from them (Mount). So forks of any
// chain, commits and workspaces resume from the same snapshot as a plain
// run, and a commit is the same ext4 layer as a cold one. A resumed VM maps
// the snapshot's RAM privately (copy-on-write), so no run sees another's
// memory.
const (
	// warmFormat is the snapshot layout version; bump it when the snapshot
	// VM's configuration (disks, command line, NIC) changes.
	warmFormat = 4
	// warmHostname is the snapshot VM's boot hostname; every resumed run
	// sets its own.
	warmHostname = "isopod-warm"
)

// errWarmUnusable marks a snapshot that could not be resumed
// (errors.Is); unusable says why.
var errWarmUnusable = errors.New("warm snapshot unusable")

// unusableError is a snapshot that could not be resumed, and why.
type unusableError struct{ err error }

func unusable(err error) error { return &unusableError{err} }

func (e *unusableError) Error() string        { return errWarmUnusable.Error() + ": " + e.err.Error() }
func (e *unusableError) Unwrap() error        { return e.err }
func (e *unusableError) Is(target error) bool { return target == errWarmUnusable }

// unusableCause is why a snapshot could not be resumed, for a warning.
func unusableCause(err error) error {
	var u *unusableError
	if errors.As(err, &u) {
		return u.err
	}
	return err
}

// warmInputs are a key and what a snapshot VM of it boots.
type warmInputs struct {
	key    warmpool.Key
	kernel kernelFiles
	base   baseImage
	// layers are an assembled snapshot's stage layers (root first; see
	// warm_assembled.go).
	layers []string
}

// warmState is an eligible run's view of the warm pool.
type warmState struct {
	in warmInputs
	// meta is the key's snapshot when one was there at planning time.
	meta *warmpool.Meta
	// root is the assembled snapshot's inputs of a run that may use one
	// (nil when it may not), rootMeta that snapshot when it was there.
	root     *warmInputs
	rootMeta *warmpool.Meta
}

// warmFor returns the warm-pool state of a run, nil when the driver cannot
// restore or the key cannot be computed (the run then boots cold).
func (s *Service) warmFor(ctx context.Context, req Request, pl *plan) *warmState {
	if s.opts.NoWarmPool {
		return nil
	}
	in, err := s.warmKeyFor(ctx, pl.base, req.VCPUs, req.MemMiB, !req.NoNetwork)
	if err != nil {
		s.log.Debug("warm pool: no key; booting cold", "err", err)
		return nil
	}
	w := &warmState{in: in}
	if m, err := s.warm.Read(in.key.ID()); err == nil {
		w.meta = m
	}
	if rootEligible(req, pl) {
		root := rootInputs(in, pl)
		w.root = &root
		if m, err := s.warm.Read(root.key.ID()); err == nil {
			w.rootMeta = m
		}
	}
	return w
}

// warmKeyFor computes the current key of a shape (base, sizes, a NIC or
// not) from the host, the boot files and the driver.
func (s *Service) warmKeyFor(ctx context.Context, base baseImage, vcpus, memMiB int, nic bool) (warmInputs, error) {
	restorer, err := s.restorer(ctx)
	if err != nil {
		return warmInputs{}, err
	}
	id, err := restorer.SnapshotIdentity(ctx)
	if err != nil {
		return warmInputs{}, err
	}
	boot, err := s.resolveBoot()
	if err != nil {
		return warmInputs{}, err
	}
	k := warmpool.Key{
		Format:     warmFormat,
		VMM:        id.VMM,
		HostKernel: warmpool.HostKernel(),
		CPUModel:   warmpool.CPUModel(),
		Accel:      string(id.Accel),
		Initramfs:  boot.Info.ContentSHA256,
		Base:       base.Flavor,
		BaseSHA256: base.SHA256,
		VCPUs:      vcpus,
		MemMiB:     memMiB,
		NIC:        nic,
		Protocol:   agentproto.Version,
	}
	if boot.BuiltInKernel {
		k.GuestKernel = fileIdentity(boot.Kernel)
	} else {
		k.GuestKernel = "sha256:" + boot.Info.KernelSHA256
	}
	return warmInputs{key: k, kernel: kernelFiles{Kernel: boot.Kernel, BzImage: boot.BzImage, Initramfs: boot.Initramfs}, base: base}, nil
}

// restorer is the driver when it can restore snapshots.
func (s *Service) restorer(ctx context.Context) (vmm.Restorer, error) {
	drv, err := s.driver(ctx)
	if err != nil {
		return nil, err
	}
	r, ok := drv.(vmm.Restorer)
	if !ok {
		return nil, fmt.Errorf("the VMM cannot restore snapshots: %w", errdefs.ErrNotSupported)
	}
	return r, nil
}

// warmConfig is the VM configuration of key's snapshot, with disks (every
// slot; see machine/disks.go) and the NIC given. A restore has the same shape.
func warmConfig(in warmInputs, id, dir string, serial io.Writer, net *vmm.Net, disks []vmm.Disk) vmm.Config {
	pl := &plan{base: in.base, kernel: in.kernel}
	return vmm.Config{
		ID:        id,
		Dir:       dir,
		Kernel:    in.kernel.Kernel,
		BzImage:   in.kernel.BzImage,
		Initrd:    in.kernel.Initramfs,
		Cmdline:   pl.cmdline(warmHostname),
		VCPUs:     in.key.VCPUs,
		MemMiB:    in.key.MemMiB,
		Disks:     disks,
		Net:       net,
		SerialLog: serial,
	}
}

// bootWarm resumes the run from its key's snapshot, building the snapshot
// first when there is none. done is false when the run must boot cold
// instead (a warning in the report says why, when it is not the ordinary
// "someone else is building").
func (r *run) bootWarm(ctx context.Context, drv vmm.Driver) (done bool, err error) {
	key := r.warm.in.key.ID()
	if r.warm.meta == nil {
		// Built since the run was planned (in the background, say)?
		r.warm.meta, _ = r.s.warm.Read(key)
	}
	if meta := r.warm.meta; meta != nil {
		err := r.resume(ctx, drv, meta)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, errWarmUnusable) {
			return false, err
		}
		if !errors.Is(err, errdefs.ErrNotFound) {
			// Not merely removed since the run was planned: retire it.
			r.s.warm.Retire(key, meta.BuildID)
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf(
				"the warm-pool snapshot %s could not be resumed (%v); it was removed and rebuilt for this run", key, unusableCause(err)))
			r.s.log.Warn("warm pool: unusable snapshot retired", "key", key, "err", err)
		}
	}
	if r.s.opts.BackgroundSnapshots {
		r.s.buildInBackground(drv, r.warm.in)
		return false, nil
	}
	return r.buildAndResume(ctx, drv)
}

// buildAndResume builds the run's snapshot (unless another builder holds the
// key, in which case the run boots cold) and resumes the run from it.
func (r *run) buildAndResume(ctx context.Context, drv vmm.Driver) (bool, error) {
	key := r.warm.in.key.ID()
	unlock, ok := r.s.warm.TryBuild(key)
	if !ok {
		r.s.log.Info("warm pool: another process is building the snapshot; booting cold", "key", key)
		return false, nil
	}
	defer unlock()
	if _, err := r.s.warm.Read(key); err != nil {
		meta, ranOn, err := r.buildInline(ctx, drv, r.warm.in)
		if meta == nil || err != nil || ranOn {
			return ranOn, err
		}
		key = meta.Key
	}
	meta, err := r.s.warm.Read(key)
	if err == nil {
		err = r.resume(ctx, drv, meta)
	}
	if err != nil {
		if !errors.Is(err, errWarmUnusable) && meta != nil {
			return false, err
		}
		if meta != nil {
			r.s.warm.Retire(key, meta.BuildID)
		}
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("the freshly built warm-pool snapshot %s could not be resumed (%v); it was removed and this run cold-booted", key, err))
		return false, nil
	}
	return true, nil
}

// buildInline builds the snapshot of in inside the run. The build is
// charged to the run's timeout: it may take half of what is left of it, so
// that a build that fails or hangs (its VM is then killed) leaves the other
// half to a cold boot. With less than inlineBuildMin for it, nothing is
// built. meta is nil, and a warning says why, when the run must boot cold.
// Where it can (runOnPlain), the snapshot VM runs on as the run's (ranOn).
func (r *run) buildInline(ctx context.Context, drv vmm.Driver, in warmInputs) (_ *warmpool.Meta, ranOn bool, _ error) {
	budget := min(snapshotBuildTimeout, time.Until(r.deadline())/2)
	if budget < inlineBuildMin {
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("no warm-pool snapshot was built for this run's shape: "+
			"half of what was left of its timeout (%.1f s) is too short for a build; this run cold-booted (`isopod warmpool build` builds it)",
			budget.Seconds()))
		return nil, false, nil
	}
	// boot_ms is a cold boot's; the snapshot VM's boot is part of
	// snapshot_build_ms.
	deadline := time.Now().Add(budget)
	b := warmBuild{
		dir: r.dir, vm: r.vm, deadline: deadline,
		started: func(m vmm.Machine) { r.rep.Accel = m.Accel() },
	}
	if r.runOnPlain() {
		b.runOn, b.runScratch, b.runScratchBytes = true, r.scratch, r.scratchBytes
	}
	meta, start, err := r.s.buildWarm(ctx, drv, in, b)
	if err == nil && start.runsOn {
		r.rep.SnapshotBuilt, r.rep.SnapshotBuildMS = true, &meta.BuildMS
		r.ranOn(start, r.scratch, false)
		return meta, true, nil
	}
	if err := r.shrinkScratch(); err != nil {
		r.s.log.Warn("warm pool: the run's scratch disk keeps its slot's size", "err", err)
	}
	switch {
	case err == nil:
		r.rep.SnapshotBuilt = true
		r.rep.SnapshotBuildMS = &meta.BuildMS
		return meta, false, nil
	case ctx.Err() != nil:
		return nil, false, ctx.Err()
	case !time.Now().Before(deadline):
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("building the warm-pool snapshot did not finish within %.1f s, "+
			"half of what was left of the run's timeout; the snapshot VM was killed and this run cold-booted (%v)", budget.Seconds(), err))
	default:
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("building the warm-pool snapshot failed (%v); this run cold-booted", err))
	}
	return nil, false, nil
}

// resume starts the run's VM from the snapshot meta and says hello. A
// failure that the snapshot may cause is wrapped in errWarmUnusable, with
// the VMM already gone.
func (r *run) resume(ctx context.Context, drv vmm.Driver, meta *warmpool.Meta) error {
	var net *vmm.Net
	if r.vm.Net != nil {
		net = r.vm.Net.VMMNet()
	}
	ph, err := machine.Placeholders(r.dir.Path())
	if err != nil {
		return err
	}
	cfg := warmConfig(r.warm.in, r.dir.Rec.ID, r.dir.Path(), r.dir.Serial, net, r.runDisks().Slots(ph))
	cfg.Logger = r.s.log
	cfg.OwnRAM, cfg.RAMFile, cfg.RAMCopy = r.ownRAM, r.ramFile(), r.ownRAM
	r.vmCfg = cfg
	rctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	t := time.Now()
	release, err := r.s.warm.Use(rctx, meta.Key)
	if err != nil {
		return err
	}
	m, err := r.vm.Restore(rctx, drv.(vmm.Restorer), cfg, r.s.warm.Dir(meta.Key))
	release()
	if err == nil {
		r.rep.Accel = m.Accel()
		r.dir.Started(m)
	}
	tRestore := time.Since(t)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(r.deadline()) {
			return errBootTimeout
		}
		return unusable(err)
	}
	r.s.log.Debug("warm pool: restored", "restore_ms", tRestore.Milliseconds())
	return r.greetResumed(ctx, rctx, meta.Key, t)
}

// greetResumed says hello to a guest resumed from key's snapshot (since
// t). A failure the snapshot may cause is wrapped in errWarmUnusable, with
// the VMM already gone. The run's root is assembled once the clone is made
// its own (configure).
func (r *run) greetResumed(ctx, rctx context.Context, key string, t time.Time) error {
	if err := r.vm.Greet(rctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return unusable(err)
	}
	r.s.warm.Used(key)
	ms := time.Since(t).Milliseconds()
	r.rep.ResumeMS = &ms
	r.rep.Path = "warm"
	r.resumed = true
	return nil
}

// configureResumed makes a resumed clone its own machine (MakeOwn) with
// the run's hostname and network.
func (r *run) configureResumed(ctx context.Context) error {
	cctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	ip, err := r.vm.MakeOwn(cctx, r.dir.Rec.Name)
	if err != nil {
		return err
	}
	r.rep.GuestIP = ip
	return nil
}
