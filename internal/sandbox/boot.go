package sandbox

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
)

// boot starts the run's network and VMM and waits for the agent's hello:
// resumed from the warm pool when the run is eligible (warm.go), else a
// cold boot.
func (r *run) boot(ctx context.Context) error {
	if !r.req.NoNetwork {
		var nic *vmnet.NIC
		if r.ready != nil {
			nic = r.ready.NIC
		}
		n, err := r.s.startNetwork(nic, r.dir.Rec.ID, r.dir.Path(), r.req.rules, r.t0, r.req.creds...)
		if err != nil {
			return err
		}
		r.vm.Net = n
	}
	if r.ready != nil {
		if done, err := r.bootReady(ctx); done || err != nil {
			return err
		}
	}
	drv, err := r.s.driver(ctx)
	if err != nil {
		return err
	}
	// The VMM's version is asked in parallel with the start (a resume
	// takes it from the snapshot's record instead).
	if r.warm == nil || r.warm.meta == nil || r.warm.meta.VMM.Name == "" {
		infoDone := make(chan struct{})
		go func() {
			defer close(infoDone)
			ictx, cancel := context.WithDeadline(ctx, r.deadline())
			defer cancel()
			if info, err := drv.Info(ictx); err == nil {
				r.rep.VMM = info
			}
		}()
		defer func() { <-infoDone }()
	} else {
		r.rep.VMM = r.warm.meta.VMM
	}
	if r.warm != nil {
		if done, err := r.bootAssembled(ctx, drv); done || err != nil {
			return err
		}
	}
	if err := r.ensureScratch(); err != nil {
		return err
	}
	if r.warm != nil {
		if done, err := r.bootWarm(ctx, drv); done || err != nil {
			return err
		}
	}
	return r.bootCold(ctx, drv, r.coldConfig())
}

// runDisks are the files behind this run's disks.
func (r *run) runDisks() machine.Disks {
	var image string
	if r.ws != nil {
		image = r.ws.Image
	}
	return r.plan.disks(r.scratch, image, r.wsUpper)
}

// mountRoot tells the guest which disks make the run's root (after a
// resume, to drop what it cached of the snapshot's placeholders first).
func (r *run) mountRoot(ctx context.Context, flush bool) error {
	if err := r.vm.Mount(ctx, r.runDisks(), r.workspaceDir(), flush, r.deadline()); err != nil {
		return fmt.Errorf("assembling the guest's root: %w (see %s)", err, r.rep.SerialLogPath)
	}
	return nil
}

// spec is the run's VM as planned: the plan's kernel, disks and
// environment, the request's sizes and network, the record's name.
func (r *run) spec() machine.Spec {
	sp := machine.Spec{
		ID:        r.dir.Rec.ID,
		Dir:       r.dir.Path(),
		Kernel:    r.plan.kernel.Kernel,
		BzImage:   r.plan.kernel.BzImage,
		Initrd:    r.plan.kernel.Initramfs,
		VCPUs:     r.req.VCPUs,
		MemMiB:    r.req.MemMiB,
		Disks:     r.runDisks(),
		Hostname:  r.dir.Rec.Name,
		Env:       r.plan.env,
		SerialLog: r.dir.Serial,
		Logger:    r.s.log,
	}
	if !r.req.NoNetwork {
		sp.Network = &r.req.rules
	}
	if r.warm != nil {
		sp.SnapshotKey = r.warm.in.key.ID()
	}
	return sp
}

// coldConfig is the run's VM: the plan's kernel, command line and disks,
// and the network when it has one.
func (r *run) coldConfig() vmm.Config {
	var net *vmm.Net
	if r.vm.Net != nil {
		net = r.vm.Net.VMMNet()
	}
	cfg := r.spec().ColdConfig(net)
	cfg.RAMFile = r.ramFile()
	return cfg
}

// ramFile is a held VM's guest RAM file (vmm.Config.RAMFile), new in its
// VM directory, which its first pause takes in place as its later ones
// do; "" for a run's VM, whose RAM is a memfd.
func (r *run) ramFile() string {
	if !r.ownRAM {
		return ""
	}
	return filepath.Join(r.dir.Path(), machine.RAMFile)
}

// bootCold starts the VMM with cfg and waits for the agent's hello.
func (r *run) bootCold(ctx context.Context, drv vmm.Driver, cfg vmm.Config) error {
	bootCtx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	tBoot := time.Now()
	r.vmCfg = cfg
	err := r.vm.Boot(bootCtx, drv, cfg)
	m, _ := r.vm.Current() // nil: the VMM did not start
	if m != nil {
		r.rep.Accel = m.Accel()
		r.dir.Started(m)
	}
	var be *machine.BootError
	switch {
	case err != nil && ctx.Err() == nil && bootCtx.Err() != nil:
		return errBootTimeout
	case errors.As(err, &be):
		return fmt.Errorf("the guest could not assemble its root filesystem (%s); see %s: %w",
			be.Reason, r.rep.SerialLogPath, errdefs.ErrFailedPrecondition)
	case err != nil && m != nil:
		return fmt.Errorf("%w; see %s", err, r.rep.SerialLogPath)
	case err != nil:
		return err
	}
	if err := r.mountRoot(ctx, false); err != nil {
		if ctx.Err() == nil && !time.Now().Before(r.deadline()) {
			return errBootTimeout
		}
		return err
	}
	boot := time.Since(tBoot).Milliseconds()
	r.rep.BootMS = &boot
	return nil
}

// configure sends the clock and the network to a cold-booted guest; a
// resumed one gets more (configureResumed).
func (r *run) configure(ctx context.Context) error {
	if r.ready != nil {
		return nil // made its own at its claim, its root assembled before
	}
	if r.resumed {
		err := r.configureResumed(ctx)
		if err == nil && !r.rootAssembled {
			// The snapshot is sound; what the run's own disks hold is not
			// its fault, so a failure here fails the run as it would a
			// cold boot. The root is mounted with the run's clock and
			// entropy in force.
			err = r.mountRoot(ctx, true)
		}
		if err != nil && ctx.Err() == nil && !time.Now().Before(r.deadline()) {
			// The run's time ran out before its command started: a
			// timed-out run, as when a cold boot outlasts it.
			return errBootTimeout
		}
		return err
	}
	cctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	ip, err := r.vm.Configure(cctx)
	if err != nil {
		return err
	}
	r.rep.GuestIP = ip
	return nil
}
