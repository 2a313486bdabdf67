package sandbox

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/admission"
	"isopod/internal/egress"
	"isopod/internal/image"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmrecord"
	"isopod/internal/warmpool"
)

// Bounds of a snapshot build.
const (
	// snapshotBuildTimeout bounds a whole snapshot build (boot, preparing
	// the guest, writing).
	snapshotBuildTimeout = 3 * time.Minute
)

// inlineBuildMin is the least time a build inside a run gets (half of
// what is left of the run's timeout, see buildAndResume): a run whose
// timeout leaves less boots cold and builds nothing, rather than spend the
// time on a build that cannot finish. A variable for tests.
var inlineBuildMin = 15 * time.Second

// warmBuild is where a snapshot VM runs: a VM directory and a vm whose
// network (if any) the snapshot VM uses. The builder's machine is dropped
// when the build ends.
type warmBuild struct {
	dir      *vmrecord.Dir
	vm       *machine.Machine
	deadline time.Time
	started  func(vmm.Machine) // called once the VMM runs; may be nil
	// runOn keeps the snapshot VM running after its snapshot, as the VM
	// of the run that built it: an assembled snapshot's (its scratch disk,
	// buildScratchName, is copied into the snapshot and the VM keeps it;
	// warm_assembled.go), or a plain one's whose scratch slot holds the
	// run's own scratch disk, runScratch (warm_runon.go).
	// runScratchBytes is the size of runScratch before it was grown
	// to fill its slot; FitSlots cuts it back before the run's command.
	runOn           bool
	runScratch      string
	runScratchBytes int64
}

// buildStart is how a snapshot VM started: cloned from its shape's plain
// snapshot or booted, and how long it took until its agent answered; and
// whether it runs on after its snapshot (warmBuild.runOn, done).
type buildStart struct {
	ms     int64
	cloned bool
	runsOn bool
}

// buildWarm starts the snapshot VM of in (startSnapshotVM), readies it,
// snapshots it and publishes the snapshot. The caller holds in's build
// lock. The VM is dropped unless b.runOn and the snapshot was published.
func (s *Service) buildWarm(ctx context.Context, drv vmm.Driver, in warmInputs, b warmBuild) (*warmpool.Meta, buildStart, error) {
	t0 := time.Now()
	bctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	defer os.Remove(filepath.Join(b.dir.Path(), buildRAMName))
	m, cloned, err := s.startSnapshotVM(bctx, drv, in, b)
	kept := false
	defer func() {
		if !kept {
			b.vm.Drop()
		}
	}()
	var root *machine.Disks
	scratch := ""
	if in.key.Assembled {
		d := snapshotDisks(in, b)
		root, scratch = &d, d.Scratch
		defer func() {
			if !kept {
				os.Remove(scratch)
			}
		}()
	}
	if err != nil {
		return nil, buildStart{}, err
	}
	start := buildStart{ms: time.Since(t0).Milliseconds(), cloned: cloned}
	if err := b.vm.PrepareForSnapshot(bctx, root, b.deadline, s.log); err != nil {
		return nil, start, err
	}
	info, err := drv.Info(bctx)
	if err != nil {
		return nil, start, err
	}
	// The key records the accelerator the VM actually got.
	key := in.key
	key.Accel = string(m.Accel())
	runOn := b.runOn && (scratch != "" || b.runScratch != "")
	write, keep := func(tmp string) error { return b.vm.Snapshot(bctx, tmp) }, scratch
	if runOn {
		// An assembled snapshot's scratch is copied while the guest is
		// stopped, as the guest's memory holds it at the snapshot.
		write, keep = func(tmp string) error {
			return b.vm.SnapshotRunning(bctx, tmp, func() error {
				if scratch == "" {
					return nil
				}
				return image.CopySparse(filepath.Join(tmp, warmpool.ScratchFile), scratch)
			})
		}, ""
	}
	meta, err := s.warm.Take(bctx, in.key.ID(), write, keep, func() *warmpool.Meta {
		return &warmpool.Meta{
			Key: key.ID(), Parts: key, Built: time.Now().UTC(),
			BuildMS: time.Since(t0).Milliseconds(), Accel: m.Accel(), VMM: info,
			LayerPaths: in.layers,
		}
	})
	if err != nil {
		return nil, start, err
	}
	if runOn {
		// Nothing of the run's has run in the VM yet.
		tFit := time.Now()
		if err := b.vm.FitSlots(bctx, snapshotDisks(in, b), b.runScratchBytes); err != nil {
			s.log.Warn("warm pool: the snapshot VM cannot run on as its run's; the run resumes a clone", "err", err)
			runOn = false
		}
		s.log.Debug("warm pool: the snapshot VM's writable slots cut", "ms", float64(time.Since(tFit).Microseconds())/1000)
	}
	kept, start.runsOn = runOn, runOn
	s.log.Info("warm pool: snapshot built", "key", meta.Key, "ms", meta.BuildMS, "runs_on", runOn)
	s.warm.Enforce(s.opts.WarmPoolBytes, meta.Key)
	return meta, start, nil
}

// buildRAMName is the RAM file of a snapshot VM cloned from a plain
// snapshot, in its VM directory, removed once the build ends.
const buildRAMName = "snapshot-ram"

// startSnapshotVM starts in's snapshot VM with its disk slots backed by
// its disks or placeholders, and waits for its agent's hello. An assembled
// snapshot's VM is a clone of its shape's plain snapshot where there is
// one (a resume, MakeOwn, and its root assembled as a run's would be:
// under TCG a second or so where a boot takes several).
// Otherwise, or when the clone fails, it boots (cloned is false). The
// caller drops b.vm.
func (s *Service) startSnapshotVM(ctx context.Context, drv vmm.Driver, in warmInputs, b warmBuild) (_ vmm.Machine, cloned bool, _ error) {
	var net *vmm.Net
	if b.vm.Net != nil {
		net = b.vm.Net.VMMNet()
	}
	ph, err := machine.SnapshotPlaceholders(b.dir.Path())
	if err != nil {
		return nil, false, err
	}
	var plain *warmpool.Meta // the clone's, for an assembled snapshot
	if in.key.Assembled {
		if err := s.prepareScratch(filepath.Join(b.dir.Path(), buildScratchName), in.key.ScratchMiB); err != nil {
			return nil, false, err
		}
		plain, _ = s.warm.Read(in.key.Plain().ID())
	}
	cfg := warmConfig(in, b.dir.Rec.ID, b.dir.Path(), b.dir.Serial, net, snapshotDisks(in, b).Slots(ph))
	cfg.Logger = s.log
	started := func(m vmm.Machine) {
		b.dir.Started(m)
		if b.started != nil {
			b.started(m)
		}
	}
	if restorer, ok := drv.(vmm.Restorer); ok && plain != nil {
		ccfg := cfg
		ccfg.OwnRAM, ccfg.RAMFile, ccfg.RAMCopy = true, filepath.Join(b.dir.Path(), buildRAMName), true
		release, err := s.warm.Use(ctx, plain.Key)
		if err != nil {
			return nil, false, err
		}
		m, err := b.vm.CloneForSnapshot(ctx, restorer, ccfg, s.warm.Dir(plain.Key), warmHostname, started)
		release()
		if err == nil {
			return m, true, nil
		}
		s.log.Debug("warm pool: cloning the plain snapshot for an assembled one failed; booting", "err", err)
		b.vm.Drop()
		os.Remove(ccfg.RAMFile)
	}
	m, err := b.vm.BootForSnapshot(ctx, drv, cfg, started)
	return m, false, err
}

// snapshotDisks are the disks of in's snapshot VM: its base, and for an
// assembled snapshot its layers and scratch disk (a plain one's running on
// as its run's: that run's scratch disk).
func snapshotDisks(in warmInputs, b warmBuild) machine.Disks {
	d := machine.Disks{Base: in.base.Path, Scratch: b.runScratch}
	if in.key.Assembled {
		d.Layers, d.Scratch = in.layers, filepath.Join(b.dir.Path(), buildScratchName)
	}
	return d
}

// WarmBuild makes sure the snapshot that eligible runs with these sizes
// would use exists, building it when needed (waiting for another builder
// of the same key rather than racing it).
func (s *Service) WarmBuild(ctx context.Context, o warmpool.BuildOptions) (*warmpool.BuildResult, error) {
	req, err := normalize(Request{Argv: []string{"true"}, Base: o.Base, Stage: o.Stage, NoNetwork: o.NoNetwork,
		VCPUs: o.VCPUs, MemMiB: o.MemMiB}, admission.ReadHost())
	if err != nil {
		return nil, err
	}
	pl, err := s.planRun(ctx, req)
	if err != nil {
		return nil, err
	}
	drv, err := s.driver(ctx)
	if err != nil {
		return nil, err
	}
	in, err := s.warmKeyFor(ctx, pl.base, req.VCPUs, req.MemMiB, !req.NoNetwork)
	if err != nil {
		return nil, fmt.Errorf("warmpool build: %w", err)
	}
	res := &warmpool.BuildResult{OK: true, Base: pl.base.Flavor, VCPUs: req.VCPUs, MemMiB: req.MemMiB, Network: !req.NoNetwork}
	if o.Stage != "" {
		in = rootInputs(in, pl)
		res.RootAssembled, res.Stage = true, o.Stage
		if pl.stage != nil {
			res.Stage = pl.stage.ID
		}
	}
	meta, built, err := s.buildShape(ctx, drv, in)
	if err != nil {
		return nil, fmt.Errorf("warmpool build: %w", err)
	}
	res.Key, res.Built, res.Accel, res.Path = meta.Key, built, meta.Accel, s.warm.Dir(meta.Key)
	if built {
		res.BuildMS = meta.BuildMS
	}
	return res, nil
}

// buildShape makes sure in's snapshot exists, building it (waiting for
// another builder of the same key rather than racing it); built says this
// call built it.
func (s *Service) buildShape(ctx context.Context, drv vmm.Driver, in warmInputs) (_ *warmpool.Meta, built bool, _ error) {
	unlock, err := s.warm.Build(ctx, in.key.ID())
	if err != nil {
		return nil, false, err
	}
	defer unlock()
	if m, err := s.warm.Read(in.key.ID()); err == nil {
		return m, false, nil
	}
	// The snapshot VM gets a VM directory like a run, so that `isopod vm
	// gc` finds its VMM should this process die.
	d, err := vmrecord.NewDir(s.opts.Paths, []string{"isopod", "warmpool", "build"}, in.base.Flavor, BaseStage)
	if err != nil {
		return nil, false, err
	}
	defer d.End(nil)
	v := machine.New(s.log)
	defer v.Close()
	if in.key.NIC {
		if v.Net, err = s.startNetwork(nil, d.Rec.ID, d.Path(), egress.Rules{}, time.Now()); err != nil {
			return nil, false, err
		}
	}
	meta, _, err := s.buildWarm(ctx, drv, in, warmBuild{dir: d, vm: v, deadline: time.Now().Add(snapshotBuildTimeout)})
	if err != nil {
		return nil, false, fmt.Errorf("%w (console: %s)", err, d.ConsolePath())
	}
	return meta, true, nil
}
