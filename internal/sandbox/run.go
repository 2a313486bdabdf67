package sandbox

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Bounds on host-side waits that are not covered by the run's timeout.
const (
	controlTimeout = 10 * time.Second // one control message (hostname, clock, net, halt)
	execGrace      = 5 * time.Second  // the guest enforces the exec timeout; the host allows this much more
	exitWait       = 300 * time.Millisecond
)

// run is the state of one call to Run, torn down by cleanup.
type run struct {
	s      *Service
	req    Request
	rep    *Report
	t0     time.Time
	dir    string
	rec    *vmRecord
	plan   *plan
	stdout *capture
	stderr *capture
	serial *cappedWriter

	machine vmm.Machine
	client  *agentclient.Client
	network *runNetwork
	scratch string

	// Warm pool (warmpool_run.go): warm is set for an eligible run;
	// resumed once its VM came from a snapshot.
	warm      *warmState
	resumed   bool
	netClosed bool
}

// Run boots a fresh microVM, runs req.Argv in it, optionally copies files out
// and commits the scratch layer, destroys the VM and reports. A guest's
// non-zero exit is a normal report; an error means isopod itself failed.
// Cancelling ctx tears the VM down.
func (s *Service) Run(ctx context.Context, req Request) (rep *Report, retErr error) {
	t0 := time.Now()
	req, err := normalize(req, readHostLimits())
	if err != nil {
		return nil, err
	}
	// Everything that can be refused is refused before any VM starts.
	pl, err := s.planRun(ctx, req)
	if err != nil {
		return nil, err
	}
	stdin, err := openStdin(req)
	if err != nil {
		return nil, err
	}
	if c, ok := stdin.(io.Closer); ok {
		defer c.Close()
	}
	for _, c := range req.CopyOut {
		if err := checkDestination(c.Host); err != nil {
			return nil, err
		}
	}

	r := &run{s: s, req: req, t0: t0, plan: pl}
	r.warm = s.warmFor(ctx, req, pl)
	defer func() {
		// The report is complete once the VMM is killed and the network
		// totals are in; the rest of the teardown does not delay it.
		r.stopCritical()
		if rep != nil {
			rep.TotalMS = time.Since(t0).Milliseconds()
		}
		s.teardown(r.cleanup)
	}()
	if err := r.prepare(); err != nil {
		return nil, err
	}
	if err := r.boot(ctx); err != nil {
		if errors.Is(err, errBootTimeout) {
			return r.finishTimedOut(), nil
		}
		return nil, err
	}
	if err := r.configure(ctx); err != nil {
		return nil, err
	}
	done, err := r.exec(ctx, stdin)
	if err != nil {
		return nil, err
	}
	if !done.TimedOut {
		if err := r.copyOut(ctx); err != nil {
			return nil, err
		}
	}
	r.halt(ctx)
	if err := r.commit(ctx, done); err != nil {
		return nil, err
	}
	return r.rep, nil
}

var errBootTimeout = errors.New("the guest was not ready before the run's timeout")

func openStdin(req Request) (io.Reader, error) {
	if req.Stdin != nil {
		return req.Stdin, nil
	}
	if req.StdinFile == "" {
		return nil, nil
	}
	f, err := os.Open(req.StdinFile)
	if err != nil {
		return nil, fmt.Errorf("--stdin-file: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	st, err := f.Stat()
	if err != nil || st.IsDir() {
		f.Close()
		return nil, fmt.Errorf("--stdin-file %s: not a readable file: %w", req.StdinFile, errdefs.ErrInvalidArgument)
	}
	return f, nil
}

// deadline is when the run's timeout (boot and exec together) runs out.
func (r *run) deadline() time.Time {
	return r.t0.Add(time.Duration(r.req.TimeoutS) * time.Second)
}

// prepare makes the VM directory, its record, logs and scratch disk.
func (r *run) prepare() error {
	p := r.s.opts.Paths
	if err := p.Ensure(); err != nil {
		return err
	}
	id := newVMID()
	r.dir = p.VM(id)
	if err := os.Mkdir(r.dir, 0o700); err != nil {
		return fmt.Errorf("creating vm directory: %w", err)
	}
	r.rec = &vmRecord{
		ID: id, Name: vanityName(id), Created: time.Now().UTC(), Argv: r.req.Argv,
		Base: r.plan.base.Flavor, Stage: r.req.Stage,
		OwnerPID: os.Getpid(), OwnerStartTime: procStartTime(os.Getpid()),
	}
	if err := writeRecord(r.dir, r.rec); err != nil {
		return err
	}
	r.rep = &Report{
		OK: true, VMID: id, Name: r.rec.Name, Path: "cold",
		VCPUs: r.req.VCPUs, MemMiB: r.req.MemMiB, ScratchMiB: r.plan.scratchMiB,
		RootfsFlavor: r.plan.base.Flavor, BaseSHA256: r.plan.base.SHA256,
		SerialLogPath: filepath.Join(r.dir, "console.log"),
		StdoutLogPath: filepath.Join(r.dir, "stdout.log"),
		StderrLogPath: filepath.Join(r.dir, "stderr.log"),
		Warnings:      r.plan.warnings,
	}
	if r.plan.stage != nil {
		r.rep.ForkedFrom = r.plan.stage.ID
	}
	var err error
	if r.stdout, err = newCapture(r.rep.StdoutLogPath, LogCap); err != nil {
		return err
	}
	if r.stderr, err = newCapture(r.rep.StderrLogPath, LogCap); err != nil {
		return err
	}
	con, err := os.OpenFile(r.rep.SerialLogPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("creating console log: %w", err)
	}
	r.serial = &cappedWriter{w: con, cap: SerialLogCap}
	if r.warm == nil {
		// A warm-eligible run needs a scratch disk only if it falls back
		// to a plain cold boot.
		return r.ensureScratch()
	}
	return nil
}

// ensureScratch prepares the run's scratch disk once.
func (r *run) ensureScratch() error {
	if r.scratch != "" {
		return nil
	}
	scratch := filepath.Join(r.dir, "scratch.ext4")
	if err := r.s.prepareScratch(scratch, r.plan.scratchMiB); err != nil {
		return err
	}
	r.scratch = scratch
	return nil
}

// boot starts the VMM and waits for the agent's hello: resumed from the warm
// pool when the run is eligible (warmpool_run.go), else a cold boot.
func (r *run) boot(ctx context.Context) error {
	if !r.req.NoNetwork {
		n, err := r.s.startNetwork(r.rec.ID, r.dir, r.req, r.t0)
		if err != nil {
			return err
		}
		r.network = n
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
			if info, err := drv.Info(ctx); err == nil {
				r.rep.VMM = info
			}
		}()
		defer func() { <-infoDone }()
	} else {
		r.rep.VMM = r.warm.meta.VMM
	}
	if r.warm != nil {
		if done, err := r.bootWarm(ctx, drv); done || err != nil {
			return err
		}
		if err := r.ensureScratch(); err != nil {
			return err
		}
	}
	cfg := vmm.Config{
		ID:        r.rec.ID,
		Dir:       r.dir,
		Kernel:    r.plan.kernel.Kernel,
		Initrd:    r.plan.kernel.Initramfs,
		Cmdline:   r.plan.cmdline(r.rec.Name),
		VCPUs:     r.req.VCPUs,
		MemMiB:    r.req.MemMiB,
		Disks:     r.plan.disks(r.scratch),
		SerialLog: r.serial,
		Logger:    r.s.log,
	}
	if r.network != nil {
		cfg.Net = r.network.vmmNet()
	}
	return r.bootCold(ctx, drv, cfg)
}

// bootCold starts the VMM with cfg and waits for the agent's hello.
func (r *run) bootCold(ctx context.Context, drv vmm.Driver, cfg vmm.Config) error {
	bootCtx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	tBoot := time.Now()
	m, err := drv.Start(bootCtx, cfg)
	if err != nil {
		if ctx.Err() == nil && bootCtx.Err() != nil {
			return errBootTimeout
		}
		return fmt.Errorf("starting the VM: %w", err)
	}
	r.machine = m
	r.rep.Accel = m.Accel()
	r.rec.VMMPID, r.rec.VMMStartTime = m.Pid(), m.StartTime()
	writeRecord(r.dir, r.rec)

	r.client = agentclient.New(m.Agent(), r.s.log)
	helloCtx, cancelHello := context.WithDeadline(ctx, r.deadline())
	defer cancelHello()
	hello, err := r.waitHello(helloCtx)
	if err != nil {
		if ctx.Err() == nil && helloCtx.Err() != nil {
			return errBootTimeout
		}
		return err
	}
	if hello.BootError != "" {
		return fmt.Errorf("the guest could not assemble its root filesystem (%s); see %s: %w",
			hello.BootError, r.rep.SerialLogPath, errdefs.ErrFailedPrecondition)
	}
	boot := time.Since(tBoot).Milliseconds()
	r.rep.BootMS = &boot
	return nil
}

// waitHello waits for the guest's hello, failing early if the VMM exits.
func (r *run) waitHello(ctx context.Context) (agentproto.Hello, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-r.machine.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	h, err := r.client.WaitHello(ctx)
	if err != nil {
		select {
		case <-r.machine.Done():
			return h, fmt.Errorf("the VM exited before its agent was ready (%v); see %s", r.machine.Wait(), r.rep.SerialLogPath)
		default:
		}
	}
	return h, err
}

// configure sends the clock, the network and fresh entropy.
func (r *run) configure(ctx context.Context) error {
	if r.resumed {
		return r.configureResumed(ctx)
	}
	cctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	if err := r.client.Call(cctx, &agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: time.Now().UnixNano()}}, nil); err != nil {
		return fmt.Errorf("setting the guest clock: %w", err)
	}
	if r.network != nil {
		nc := r.network.agentConfig()
		if err := r.client.Call(cctx, &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: nc}, nil); err != nil {
			return fmt.Errorf("configuring the guest network: %w", err)
		}
		r.rep.GuestIP = r.network.guestIP()
	}
	return nil
}

// exec runs the command, streaming its output to the captures.
func (r *run) exec(ctx context.Context, stdin io.Reader) (*agentproto.ExecDone, error) {
	remaining := time.Until(r.deadline())
	if remaining < time.Millisecond {
		remaining = time.Millisecond
	}
	env := append(append([]string(nil), r.plan.env...), r.req.Env...)
	er := agentclient.ExecRequest{
		Exec: agentproto.Exec{
			Argv:      r.req.Argv,
			Env:       env,
			Cwd:       r.req.Cwd,
			TimeoutMS: remaining.Milliseconds(),
		},
		Stdin:  stdin,
		Stdout: r.stdout,
		Stderr: r.stderr,
	}
	ectx, cancel := context.WithTimeout(ctx, remaining+execGrace)
	defer cancel()
	t := time.Now()
	done, err := r.client.Exec(ectx, er)
	r.rep.ExecMS = time.Since(t).Milliseconds()
	if err != nil && done == nil {
		if ctx.Err() == nil && ectx.Err() != nil {
			// The guest never reported: treat as a timeout, with what arrived.
			done = &agentproto.ExecDone{TimedOut: true}
		} else {
			return nil, fmt.Errorf("running the command: %w", err)
		}
	} else if err != nil {
		return nil, fmt.Errorf("keeping the command's output: %w", err)
	}
	r.rep.ExitCode, r.rep.Signal, r.rep.TimedOut = done.ExitCode, done.Signal, done.TimedOut
	r.fillOutput()
	return done, nil
}

func (r *run) fillOutput() {
	r.rep.Stdout, r.rep.StdoutTruncated, r.rep.StdoutBytes = r.stdout.Inline()
	r.rep.Stderr, r.rep.StderrTruncated, r.rep.StderrBytes = r.stderr.Inline()
}

// copyOut copies each requested guest file to its host path, staged so that
// a failure leaves the destination as it was.
func (r *run) copyOut(ctx context.Context) error {
	if len(r.req.CopyOut) == 0 {
		return nil
	}
	t := time.Now()
	for _, c := range r.req.CopyOut {
		sf, err := newStagedFile(c.Host)
		if err != nil {
			return err
		}
		cctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		fd, err := r.client.CopyOut(cctx, c.Guest, MaxCopyOutBytes, sf)
		cancel()
		if err != nil {
			sf.Abort()
			return fmt.Errorf("--copy-out %s:%s: %w", c.Guest, c.Host, err)
		}
		if err := sf.Commit(fs.FileMode(fd.Mode)); err != nil {
			return err
		}
		r.rep.Copied = append(r.rep.Copied, Copied{Guest: c.Guest, Host: c.Host, Bytes: fd.Bytes})
	}
	ms := time.Since(t).Milliseconds()
	r.rep.CopyOutMS = &ms
	return nil
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
	if r.client != nil {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), controlTimeout)
		if err := r.client.Call(hctx, &agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil); err != nil {
			r.s.log.Debug("halt", "err", err)
		}
		cancel()
	}
	r.stopMachine()
	r.rep.TeardownMS = time.Since(t).Milliseconds()
}

// stopMachine waits briefly for the VMM to exit on its own, then kills it.
// Idempotent.
func (r *run) stopMachine() {
	if r.machine == nil {
		return
	}
	select {
	case <-r.machine.Done():
	case <-time.After(exitWait):
		r.machine.Kill()
	}
	r.machine.Wait()
	if r.client != nil {
		r.client.Close()
	}
	r.machine = nil
}

// finishTimedOut reports a run whose guest never became ready in time.
func (r *run) finishTimedOut() *Report {
	r.stopMachine()
	r.rep.TimedOut = true
	r.warnNothingCommitted()
	r.fillOutput()
	return r.rep
}

// stopCritical is the part of the teardown a report waits for: the VMM is
// killed (not waited for) and the network stack closed, its totals put in
// the report. Idempotent.
func (r *run) stopCritical() {
	if r.machine != nil {
		r.machine.Kill()
	}
	if r.network != nil && !r.netClosed {
		r.netClosed = true
		r.network.close()
		if r.rep != nil {
			r.rep.Net = r.network.report()
			if e := r.network.egressReport(); e != nil {
				r.rep.Egress = e
			}
		}
	}
}

// cleanup runs on every exit path, after stopCritical and possibly after
// the report was returned (Service.Wait waits for it): the VMM is reaped,
// the scratch disk removed, the logs closed, the record finished.
func (r *run) cleanup() {
	if r.machine != nil {
		r.machine.Kill()
		r.machine.Wait()
		r.machine = nil
	}
	if r.client != nil {
		r.client.Close()
	}
	if r.network != nil && !r.netClosed {
		r.netClosed = true
		r.network.close()
	}
	for _, c := range []io.Closer{r.stdout, r.stderr, r.serial} {
		if c != nil && !isNilCloser(c) {
			c.Close()
		}
	}
	if r.scratch != "" {
		os.Remove(r.scratch)
	}
	if r.rec != nil {
		r.rec.Finished = true
		if r.rep != nil {
			r.rec.ExitCode = r.rep.ExitCode
		}
		writeRecord(r.dir, r.rec)
	}
}

func isNilCloser(c io.Closer) bool {
	switch v := c.(type) {
	case *capture:
		return v == nil
	case *cappedWriter:
		return v == nil
	}
	return false
}

// randomBytes returns n bytes from the host's CSPRNG.
func randomBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}
