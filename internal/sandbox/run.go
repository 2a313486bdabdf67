package sandbox

import (
	"cmp"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
	"isopod/internal/report"
	"isopod/internal/vmm"
	"isopod/internal/vmrecord"
	"isopod/internal/workspace"
)

// Bounds on host-side waits that are not covered by the run's timeout.
const (
	haltTimeout = 10 * time.Second // the halt after a committing command; then the VMM is killed
)

// run is the state of one call to Run, torn down by cleanup.
type run struct {
	s      *Service
	req    Request
	rep    *report.Run
	t0     time.Time
	plan   *plan
	dir    *vmrecord.Dir
	stdout *machine.Capture
	stderr *machine.Capture

	// vm owns the VMM, the agent client and the network.
	vm      *machine.Machine
	scratch string
	// scratchBytes is the scratch disk's own size while it is grown to a
	// disk slot's (warm_runon.go); 0 otherwise.
	scratchBytes int64

	// ws is the run's workspace copy and wsUpper its writable layer
	// (workspace.go).
	ws      *workspace.Tree
	wsUpper string

	// Warm pool (warm.go): warm is set for an eligible run; resumed once
	// its VM came from a snapshot.
	warm    *warmState
	resumed bool
	// rootAssembled: the snapshot it resumed from had the run's root
	// assembled already (warm_assembled.go).
	rootAssembled bool
	// ready is the ready VM the run claimed (ready_vm.go, machine.Pool).
	ready *machine.Ready
	// unrecord: the run was refused before its VM started; its directory
	// goes with the cleanup.
	unrecord bool
	// vmCfg is the configuration the VMM was started with; ownRAM asks a
	// resume from the warm pool for RAM of the VM's own (a held VM's,
	// which a pause snapshots); paused keeps the disks a pause left for
	// a later resume (held_pause.go).
	vmCfg  vmm.Config
	ownRAM bool
	paused bool
	// resumedFrom is what a pause left of a held VM that ResumeVM
	// brought back.
	resumedFrom *pausefile.Paused
	// phases times the run's steps for the debug log.
	phases report.Phases
	// uncharged is time spent inside the run that its timeout does not
	// cover (packing the workspace).
	uncharged time.Duration
	// placeKept gives the caller's place back once cleanup has reaped
	// the VMM (admission.Ticket.Keep); nil for a held VM's run.
	placeKept func()
}

// Run boots a fresh microVM, runs req.Argv in it, optionally copies files out
// and commits the scratch layer, destroys the VM and reports. A guest's
// non-zero exit is a normal report; an error means isopod itself failed.
// Cancelling ctx tears the VM down.
func (s *Service) Run(ctx context.Context, req Request) (rep *report.Run, retErr error) {
	t0 := time.Now()
	req, pl, stdin, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	if c, ok := stdin.(io.Closer); ok {
		defer c.Close()
	}
	if req.WaitPlace != nil {
		if err := req.WaitPlace(ctx); err != nil {
			req.Workspace.Release()
			return nil, err
		}
	}
	r := s.newRun(ctx, req, pl, t0)
	defer func() {
		// The report is complete once the VMM is killed and the network
		// totals are in; the rest of the teardown does not delay it.
		r.stopCritical()
		if rep != nil {
			rep.TotalMS = time.Since(t0).Milliseconds()
		}
		r.phases.End(s.log, r.rep, t0)
		s.teardown(r.cleanup)
		// A shape that resumed is hot: keep a VM of it ready.
		if sp, ok := r.readySpecFor(); ok && r.resumed {
			s.ready.NoteHot(sp)
		}
	}()
	if err := r.step("prepared", r.prepare()); err != nil {
		return nil, err
	}
	if err := r.packWorkspace(ctx); err != nil {
		// Refused before any VM started: no record of it stays.
		r.unrecord = r.ready == nil
		return nil, err
	}
	if err := r.step("booted", r.boot(ctx)); err != nil {
		if errors.Is(err, errBootTimeout) {
			return r.finishTimedOut(), nil
		}
		return nil, err
	}
	if err := r.step("configured", r.configure(ctx)); err != nil {
		if errors.Is(err, errBootTimeout) {
			return r.finishTimedOut(), nil
		}
		if r.died(ctx, err) {
			r.guestDied()
			return r.rep, nil
		}
		return nil, err
	}
	done, err := r.exec(ctx, stdin)
	if err != nil {
		if r.died(ctx, err) {
			r.guestDied()
			return r.rep, nil
		}
		return nil, err
	}
	if !done.TimedOut {
		if err := r.copyOut(ctx); err != nil {
			return nil, err
		}
		r.workspaceOut(ctx)
	}
	r.halt(ctx)
	r.commit(ctx, done)
	return r.rep, nil
}

// step notes that the step name ended (report.Phases) and passes on its
// error.
func (r *run) step(name string, err error) error {
	r.phases.Mark(name, r.t0)
	return err
}

// died reports whether err means the guest went away (its channel closed or
// its VMM exited) while the caller still wanted the run.
func (r *run) died(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, agentclient.ErrClosed) {
		return true
	}
	m, _ := r.vm.Current()
	if m == nil {
		return false
	}
	select {
	case <-m.Done():
		return true
	default:
		return false
	}
}

var errBootTimeout = errors.New("the guest was not ready before the run's timeout")

// guestDied turns a guest that went away into a result: the report says
// so and why, from the end of the guest console, and keeps what output
// arrived. The VMM is reaped.
func (r *run) guestDied() {
	r.rep.GuestDied = true
	r.rep.GuestDiedReason = r.vm.Died(r.rep.SerialLogPath)
	r.warnNothingCommitted()
	r.fillOutput()
	r.s.log.Warn("the guest died", "vm", r.rep.VMID, "reason", r.rep.GuestDiedReason)
}

// deadline is when the run's timeout (boot and exec together, a snapshot
// build on first use included) runs out; time the timeout does not cover
// (packing the workspace) moves it.
func (r *run) deadline() time.Time {
	return r.t0.Add(time.Duration(r.req.TimeoutS)*time.Second + r.uncharged)
}

// prepare makes the VM directory, its record, logs and scratch disk.
func (r *run) prepare() error {
	if r.ready != nil {
		r.adoptReady()
	} else {
		d, err := vmrecord.NewDir(r.s.opts.Paths, r.req.Argv, r.plan.base.Flavor, r.req.Stage)
		if err != nil {
			return err
		}
		r.dir = d
	}
	d := r.dir
	var err error
	r.rep = &report.Run{
		OK: true, VMID: d.Rec.ID, Name: d.Rec.Name, Argv: r.req.Argv, Path: "cold",
		VCPUs: r.req.VCPUs, MemMiB: r.req.MemMiB, ScratchMiB: r.plan.scratchMiB,
		RootfsFlavor: r.plan.base.Flavor, BaseSHA256: r.plan.base.SHA256,
		SerialLogPath: d.ConsolePath(),
		StdoutLogPath: filepath.Join(d.Path(), "stdout.log"),
		StderrLogPath: filepath.Join(d.Path(), "stderr.log"),
		Warnings:      r.plan.warnings,
	}
	r.rep.Warnings = append(r.rep.Warnings, r.s.jailReport()...)
	if r.plan.stage != nil {
		r.rep.ForkedFrom = r.plan.stage.ID
	}
	if r.stdout, err = machine.NewCapture(r.rep.StdoutLogPath, LogCap); err != nil {
		return err
	}
	if r.stderr, err = machine.NewCapture(r.rep.StderrLogPath, LogCap); err != nil {
		return err
	}
	if r.ready == nil && r.warm != nil && r.warm.root != nil {
		return nil // made at boot, unless the assembled snapshot's copy serves
	}
	return r.ensureScratch()
}

// ensureScratch prepares the run's scratch disk once.
func (r *run) ensureScratch() error {
	if r.scratch != "" {
		return nil
	}
	scratch := filepath.Join(r.dir.Path(), "scratch.ext4")
	if err := r.s.prepareScratch(scratch, r.plan.scratchMiB); err != nil {
		return err
	}
	r.scratch = scratch
	return nil
}

// exec runs the command, streaming its output to the captures.
func (r *run) exec(ctx context.Context, stdin io.Reader) (*agentproto.ExecDone, error) {
	res, err := r.vm.Exec(ctx, machine.Exec{
		Argv:    r.req.Argv,
		Env:     r.spec().ExecEnv(r.req.Env),
		Cwd:     cmp.Or(r.req.Cwd, r.workspaceDir(), r.plan.cwd),
		Timeout: time.Until(r.deadline()),
		Stdin:   stdin,
		Stdout:  r.stdout,
		Stderr:  r.stderr,
	})
	r.phases.Mark("executed", r.t0)
	if res != nil {
		r.rep.ExecMS = res.Elapsed.Milliseconds()
	}
	if err != nil {
		return nil, err
	}
	r.rep.ExitCode, r.rep.Signal, r.rep.TimedOut = res.ExitCode, res.Signal, res.TimedOut
	r.fillOutput()
	return &res.ExecDone, nil
}

func (r *run) fillOutput() {
	r.rep.Stdout, r.rep.StdoutTruncated, r.rep.StdoutBytes = r.stdout.Inline()
	r.rep.Stderr, r.rep.StderrTruncated, r.rep.StderrBytes = r.stderr.Inline()
}

// halt asks the guest to sync and power off, then makes sure the VMM is gone.
// Without a commit nothing in the guest is needed any more: the VMM is
// killed at once.
func (r *run) halt(ctx context.Context) {
	t := time.Now()
	if r.req.CommitAs == "" {
		r.stopCritical()
		r.rep.TeardownMS = time.Since(t).Milliseconds()
		return
	}
	if err := r.vm.Halt(ctx, haltTimeout); err != nil {
		r.s.log.Debug("halt", "err", err)
	}
	r.rep.TeardownMS = time.Since(t).Milliseconds()
}

// finishTimedOut reports a run whose guest never became ready in time.
func (r *run) finishTimedOut() *report.Run {
	r.vm.Drop()
	r.rep.TimedOut = true
	r.warnNothingCommitted()
	r.fillOutput()
	return r.rep
}

// newRun is an admitted request's run: its warm-pool path chosen and a
// ready VM claimed where one fits; ready VMs whose places were lent to it
// and that it did not claim end before its own VM starts. It keeps the
// caller's place until its cleanup: the place is free once the VMM is
// reaped, not when the report is made.
func (s *Service) newRun(ctx context.Context, req Request, pl *plan, t0 time.Time) *run {
	r := &run{s: s, req: req, t0: t0, plan: pl, vm: machine.New(s.log), placeKept: req.Place.Keep()}
	r.warm = s.warmFor(ctx, req, pl)
	r.phases.Mark("admitted", t0)
	if sp, ok := r.readySpecFor(); ok && r.warm.meta != nil {
		r.ready = s.ready.Claim(sp, r.warm.meta.BuildID)
	}
	s.ready.Settle(req.Place)
	return r
}

// stopCritical is the part of the teardown a report waits for: the VMM is
// killed (not waited for) and the network closed, its totals put in the
// report. Idempotent.
func (r *run) stopCritical() {
	r.vm.Kill()
	if r.vm.CloseNet() && r.rep != nil {
		n := r.vm.Net
		r.rep.Net = n.Report()
		if e := n.EgressReport(); e != nil {
			r.rep.Egress = e
		}
	}
}

// cleanup runs on every exit path, after stopCritical and possibly after
// the report was returned (Service.Wait waits for it): the VM is ended, the
// scratch disk removed, the logs closed, the record finished.
func (r *run) cleanup() {
	r.vm.Close()
	if r.placeKept != nil {
		defer r.placeKept()
	}
	for _, c := range []*machine.Capture{r.stdout, r.stderr} {
		if c != nil {
			c.Close()
		}
	}
	if r.paused {
		r.dir.Pause()
		return
	}
	r.closeWorkspace()
	if r.ready != nil && r.ready.NIC != nil {
		r.ready.NIC.Close() // parked, and not taken by a network
	}
	if r.dir != nil {
		machine.CleanDisks(r.dir.Path(), r.scratch)
	}
	if r.dir != nil {
		var code *int
		if r.rep != nil {
			code = r.rep.ExitCode
		}
		r.dir.End(code)
		if r.unrecord {
			os.RemoveAll(r.dir.Path())
		}
	}
}
