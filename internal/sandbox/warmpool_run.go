package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/gofrs/flock"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Bounds of the warm path.
const (
	// resumeHelloTimeout bounds the hello after a restore: a healthy
	// snapshot answers in milliseconds, a corrupt one may never.
	resumeHelloTimeout = 10 * time.Second
	// linkSettle is how long the snapshot VM stays up after its NIC came
	// up: the guest kernel's link-event batching interval (one second)
	// with some margin.
	linkSettle = 1200 * time.Millisecond
	// snapshotTimeout bounds writing a snapshot.
	snapshotTimeout = 2 * time.Minute
)

// warmState is an eligible run's view of the warm pool.
type warmState struct {
	in warmInputs
	// meta is the key's snapshot when one was there at planning time.
	meta *warmMeta
}

// warmEligible reports whether req may resume from the warm pool: a fresh
// base with no layers, networking on, no commit, the default scratch.
// (Filtered egress is networked, so it is eligible.)
func warmEligible(req Request, pl *plan) bool {
	return req.Stage == BaseStage && len(pl.layers) == 0 && pl.stage == nil &&
		!req.NoNetwork && req.CommitAs == "" && req.ScratchMiB == 0
}

// warmFor returns the warm-pool state of an eligible run, nil otherwise
// (also when the driver cannot restore or the key cannot be computed; the
// run then boots cold).
func (s *Service) warmFor(ctx context.Context, req Request, pl *plan) *warmState {
	if !warmEligible(req, pl) {
		return nil
	}
	drv, err := s.driver(ctx)
	if err != nil {
		return nil
	}
	if _, ok := drv.(vmm.Restorer); !ok {
		return nil
	}
	in, err := s.warmKeyFor(ctx, pl.base, req.VCPUs, req.MemMiB)
	if err != nil {
		s.log.Debug("warm pool: no key; booting cold", "err", err)
		return nil
	}
	w := &warmState{in: in}
	if m, err := readWarm(s.warmDir(in.key.ID())); err == nil {
		w.meta = m
	}
	return w
}

// warmCmdline is the snapshot VM's kernel command line: the plan's, with
// a neutral hostname and the overlay upper in RAM.
func warmCmdline(pl *plan) string {
	return pl.cmdline(warmHostname) + " isopod.upper=ram"
}

// warmConfig is the VM configuration of key's snapshot: base disk, NIC, no
// scratch. A restore must use the same shape.
func warmConfig(in warmInputs, id, dir string, serial io.Writer, net *vmm.Net) vmm.Config {
	pl := &plan{base: in.base, kernel: in.kernel}
	cfg := vmm.Config{
		ID:        id,
		Dir:       dir,
		Kernel:    in.kernel.Kernel,
		Initrd:    in.kernel.Initramfs,
		Cmdline:   warmCmdline(pl),
		VCPUs:     in.key.VCPUs,
		MemMiB:    in.key.MemMiB,
		Disks:     []vmm.Disk{{Path: in.base.Path, ReadOnly: true, Serial: "isopod-base"}},
		Net:       net,
		SerialLog: serial,
	}
	return cfg
}

// bootWarm resumes the run from its key's snapshot, building the snapshot
// first when there is none. done is false when the run must boot cold
// instead (a warning in the report says why, when it is not the ordinary
// "someone else is building").
func (r *run) bootWarm(ctx context.Context, drv vmm.Driver) (done bool, err error) {
	key := r.warm.in.key.ID()
	dir := r.s.warmDir(key)
	if meta := r.warm.meta; meta != nil {
		err := r.resume(ctx, drv, dir, meta)
		if err == nil {
			r.rep.Path = "warm"
			return true, nil
		}
		if !errors.Is(err, errWarmUnusable) {
			return false, err
		}
		if errors.Is(err, errdefs.ErrNotFound) {
			// Removed since the run was planned (warmpool rm): rebuild.
			return r.buildAndResume(ctx, drv)
		}
		r.s.retireWarm(key, meta.BuildID)
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf(
			"the warm-pool snapshot %s could not be resumed (%v); it was removed, this run cold-booted and rebuilt it", key, errors.Unwrap(err)))
		r.s.log.Warn("warm pool: unusable snapshot retired", "key", key, "err", err)
	}
	return r.buildAndResume(ctx, drv)
}

// buildAndResume builds the run's snapshot (unless another builder holds the
// key, in which case the run boots cold) and resumes the run from it.
func (r *run) buildAndResume(ctx context.Context, drv vmm.Driver) (bool, error) {
	key := r.warm.in.key.ID()
	lk := flock.New(r.s.warmLockPath(key, "build"))
	if ok, err := lk.TryLock(); err != nil || !ok {
		r.s.log.Info("warm pool: another process is building the snapshot; booting cold", "key", key)
		return false, nil
	}
	defer lk.Unlock()
	dir := r.s.warmDir(key)
	if _, err := readWarm(dir); err != nil {
		meta, bootMS, err := r.s.buildWarm(ctx, drv, r.warm.in, warmBuild{
			id: r.rec.ID, dir: r.dir, serial: r.serial, net: r.network.vmmNet(), agentNet: r.network.agentConfig(),
			deadline: r.deadline(),
			started: func(m vmm.Machine) {
				r.rep.Accel = m.Accel()
				r.rec.VMMPID, r.rec.VMMStartTime = m.Pid(), m.StartTime()
				writeRecord(r.dir, r.rec)
			},
		})
		if bootMS > 0 {
			r.rep.BootMS = &bootMS
		}
		if err != nil {
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			if time.Now().After(r.deadline()) {
				return false, errBootTimeout
			}
			r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("building the warm-pool snapshot failed (%v); this run cold-booted", err))
			return false, nil
		}
		r.rep.SnapshotBuilt = true
		r.rep.SnapshotBuildMS = &meta.BuildMS
		key = meta.Key
		dir = r.s.warmDir(key)
	}
	meta, err := readWarm(dir)
	if err == nil {
		err = r.resume(ctx, drv, dir, meta)
	}
	if err != nil {
		if !errors.Is(err, errWarmUnusable) && meta != nil {
			return false, err
		}
		if meta != nil {
			r.s.retireWarm(key, meta.BuildID)
		}
		r.rep.Warnings = append(r.rep.Warnings, fmt.Sprintf("the freshly built warm-pool snapshot %s could not be resumed (%v); it was removed and this run cold-booted", key, err))
		return false, nil
	}
	return true, nil
}

// resume starts the run's VM from the snapshot in dir and says hello. A
// failure that the snapshot may cause is wrapped in errWarmUnusable, with
// the VMM already gone.
func (r *run) resume(ctx context.Context, drv vmm.Driver, dir string, meta *warmMeta) error {
	restorer := drv.(vmm.Restorer)
	cfg := warmConfig(r.warm.in, r.rec.ID, r.dir, r.serial, r.network.vmmNet())
	cfg.Logger = r.s.log
	rctx, cancel := context.WithDeadline(ctx, r.deadline())
	defer cancel()
	t := time.Now()
	lk := flock.New(r.s.warmLockPath(meta.Key, "lock"))
	if err := lk.RLock(); err != nil {
		return fmt.Errorf("warm pool: locking %s: %w", meta.Key, err)
	}
	m, err := restorer.Restore(rctx, cfg, dir)
	lk.Unlock()
	tRestore := time.Since(t)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(r.deadline()) {
			return errBootTimeout
		}
		return fmt.Errorf("%w: %w", errWarmUnusable, err)
	}
	r.machine = m
	r.rep.Accel = m.Accel()
	r.rec.VMMPID, r.rec.VMMStartTime = m.Pid(), m.StartTime()
	writeRecord(r.dir, r.rec)
	r.client = agentclient.New(m.Agent(), r.s.log)
	hctx, cancelHello := context.WithTimeout(rctx, resumeHelloTimeout)
	defer cancelHello()
	h, err := helloOrExit(hctx, m, r.client, r.client.Hello)
	if err == nil && h.BootError != "" {
		err = fmt.Errorf("the snapshot's guest reports a boot error: %s", h.BootError)
	}
	if err != nil {
		m.Kill()
		m.Wait()
		r.client.Close()
		r.machine, r.client = nil, nil
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return fmt.Errorf("%w: %w", errWarmUnusable, err)
	}
	ms := time.Since(t).Milliseconds()
	r.s.log.Debug("warm pool: resumed", "restore_ms", tRestore.Milliseconds(), "total_ms", ms)
	r.rep.ResumeMS = &ms
	r.resumed = true
	return nil
}

// helloOrExit runs hello (a wait for the guest's or an explicit round trip),
// failing early when the VMM exits.
func helloOrExit(ctx context.Context, m vmm.Machine, c *agentclient.Client, hello func(context.Context) (agentproto.Hello, error)) (agentproto.Hello, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-m.Done():
			cancel()
		case <-ctx.Done():
		}
	}()
	h, err := hello(ctx)
	if err != nil {
		select {
		case <-m.Done():
			return h, fmt.Errorf("the VM exited (%v): %w", m.Wait(), err)
		default:
		}
	}
	return h, err
}

// configureResumed makes a resumed clone its own machine before anything
// runs: fresh entropy mixed into the kernel pool with a CRNG reseed, the
// host's wall clock, the run's hostname and the run's network. The
// requests are independent and go out together.
func (r *run) configureResumed(ctx context.Context) error {
	cctx, cancel := context.WithTimeout(ctx, controlTimeout)
	defer cancel()
	var nc *agentproto.NetConfig
	if r.network != nil {
		nc = r.network.agentConfig()
	}
	calls := []struct {
		what    string
		msg     *agentproto.Msg
		payload []byte
	}{
		{"adding entropy", &agentproto.Msg{Kind: agentproto.KindAddEntropy}, randomBytes(warmEntropyBytes)},
		{"setting the guest clock", &agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: time.Now().UnixNano()}}, nil},
		{"setting the hostname", &agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: r.rec.Name}, nil},
	}
	if nc != nil {
		calls = append(calls, struct {
			what    string
			msg     *agentproto.Msg
			payload []byte
		}{"configuring the guest network", &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: nc}, nil})
	}
	errs := make([]error, len(calls))
	var wg sync.WaitGroup
	t := time.Now()
	for i, c := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := r.client.Call(cctx, c.msg, c.payload); err != nil {
				errs[i] = fmt.Errorf("%s after resume: %w", c.what, err)
			}
		}()
	}
	wg.Wait()
	r.s.log.Debug("warm pool: clone configured", "ms", time.Since(t).Milliseconds())
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if r.network != nil {
		r.rep.GuestIP = r.network.guestIP()
	}
	return nil
}

// warmBuild is where a snapshot VM runs.
type warmBuild struct {
	id, dir  string
	serial   io.Writer
	net      *vmm.Net
	agentNet *agentproto.NetConfig // brought up before the snapshot
	deadline time.Time
	started  func(vmm.Machine) // called once the VMM runs; may be nil
}

// buildWarm cold-boots the snapshot VM of in, waits for its agent, snapshots
// it and publishes the snapshot. The caller holds in's build lock. It
// returns the published snapshot and the boot time.
func (s *Service) buildWarm(ctx context.Context, drv vmm.Driver, in warmInputs, b warmBuild) (*warmMeta, int64, error) {
	t0 := time.Now()
	cfg := warmConfig(in, b.id, b.dir, b.serial, b.net)
	cfg.Logger = s.log
	bctx, cancel := context.WithDeadline(ctx, b.deadline)
	defer cancel()
	m, err := drv.Start(bctx, cfg)
	if err != nil {
		return nil, 0, fmt.Errorf("starting the snapshot VM: %w", err)
	}
	defer func() {
		m.Kill()
		m.Wait()
	}()
	if b.started != nil {
		b.started(m)
	}
	snapper, ok := m.(vmm.Snapshotter)
	if !ok {
		return nil, 0, fmt.Errorf("the VMM cannot snapshot: %w", errdefs.ErrNotSupported)
	}
	c := agentclient.New(m.Agent(), s.log)
	defer c.Close()
	h, err := helloOrExit(bctx, m, c, c.WaitHello)
	if err != nil {
		return nil, 0, fmt.Errorf("waiting for the snapshot VM's agent: %w", err)
	}
	if h.BootError != "" {
		return nil, 0, fmt.Errorf("the snapshot VM could not assemble its root (%s): %w", h.BootError, errdefs.ErrFailedPrecondition)
	}
	bootMS := time.Since(t0).Milliseconds()
	// The NIC is brought up (and addressed like every run's private
	// network) before the snapshot: the link coming up is the slow part
	// of configuring it, and a resumed run's agent then finds the same
	// configuration already in force.
	var netUp time.Time
	if b.agentNet != nil {
		nc := *b.agentNet
		nc.Env = nil // a run's own variables (proxies) are not the snapshot's
		if err := c.Call(bctx, &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &nc}, nil); err != nil {
			return nil, bootMS, fmt.Errorf("configuring the snapshot VM's network: %w", err)
		}
		netUp = time.Now()
	}
	// The guest's page cache gets the shell binary, which nearly every
	// command starts through: each resumed run would otherwise read and
	// decompress it from the base image itself.
	if _, err := c.CopyOut(bctx, "/bin/sh", 64<<20, io.Discard); err != nil {
		s.log.Debug("warm pool: prefetching /bin/sh", "err", err)
	}
	info, err := drv.Info(ctx)
	if err != nil {
		return nil, bootMS, err
	}

	// The key records the accelerator the VM actually got.
	key := in.key
	key.Accel = string(m.Accel())
	id := key.ID()
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, bootMS, err
	}
	tmp := filepath.Join(s.opts.Paths.Snapshots(), warmTmpPrefix+in.key.ID()+"-"+randomHex(4))
	if err := os.Mkdir(tmp, 0o700); err != nil {
		return nil, bootMS, fmt.Errorf("warm pool: %w", err)
	}
	published := false
	defer func() {
		if !published {
			os.RemoveAll(tmp)
		}
	}()
	// The guest kernel batches link events for up to a second after the
	// NIC came up; a snapshot taken before that would leave every clone
	// to process them while it answers its first request.
	if wait := time.Until(netUp.Add(linkSettle)); !netUp.IsZero() && wait > 0 {
		select {
		case <-time.After(wait):
		case <-bctx.Done():
			return nil, bootMS, fmt.Errorf("waiting for the snapshot VM's link to settle: %w", bctx.Err())
		}
	}
	sctx, cancelSnap := context.WithTimeout(ctx, snapshotTimeout)
	defer cancelSnap()
	if err := snapper.Snapshot(sctx, tmp); err != nil {
		return nil, bootMS, err
	}
	m.Kill()
	meta := &warmMeta{
		Key: id, Parts: key, BuildID: randomHex(8), Built: time.Now().UTC(),
		BuildMS: time.Since(t0).Milliseconds(), Accel: m.Accel(), VMM: info,
	}
	if err := writeJSONFile(filepath.Join(tmp, warmMetaFile), meta); err != nil {
		return nil, bootMS, err
	}
	if err := s.publishWarm(tmp, id); err != nil {
		return nil, bootMS, err
	}
	published = true
	s.log.Info("warm pool: snapshot built", "key", id, "ms", meta.BuildMS)
	return meta, bootMS, nil
}

func writeJSONFile(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// WarmBuildOptions are `isopod warmpool build`'s flags; zero means the
// run default.
type WarmBuildOptions struct {
	Base   string
	VCPUs  int
	MemMiB int
}

type WarmBuildResult struct {
	OK      bool      `json:"ok"`
	Key     string    `json:"key"`
	Built   bool      `json:"built"` // false: a current snapshot was already there
	BuildMS int64     `json:"build_ms,omitempty"`
	Base    string    `json:"base"`
	VCPUs   int       `json:"vcpus"`
	MemMiB  int       `json:"mem_mib"`
	Accel   vmm.Accel `json:"accel"`
	Path    string    `json:"path"`
}

// WarmBuild makes sure the snapshot that eligible runs with these sizes
// would use exists, building it when needed (waiting for another builder
// of the same key rather than racing it).
func (s *Service) WarmBuild(ctx context.Context, o WarmBuildOptions) (*WarmBuildResult, error) {
	req, err := normalize(Request{Argv: []string{"true"}, Base: o.Base, VCPUs: o.VCPUs, MemMiB: o.MemMiB}, readHostLimits())
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
	if _, ok := drv.(vmm.Restorer); !ok {
		return nil, fmt.Errorf("warmpool build: the VMM cannot restore snapshots: %w", errdefs.ErrNotSupported)
	}
	in, err := s.warmKeyFor(ctx, pl.base, req.VCPUs, req.MemMiB)
	if err != nil {
		return nil, err
	}
	if err := s.opts.Paths.Ensure(); err != nil {
		return nil, err
	}
	res := &WarmBuildResult{OK: true, Base: pl.base.Flavor, VCPUs: req.VCPUs, MemMiB: req.MemMiB}
	lk := flock.New(s.warmLockPath(in.key.ID(), "build"))
	if ok, err := lk.TryLockContext(ctx, 100*time.Millisecond); err != nil || !ok {
		return nil, fmt.Errorf("warmpool build: waiting for another builder: %w", err)
	}
	defer lk.Unlock()
	if m, err := readWarm(s.warmDir(in.key.ID())); err == nil {
		res.Key, res.Accel, res.Path = m.Key, m.Accel, s.warmDir(m.Key)
		return res, nil
	}

	// The snapshot VM gets a VM record like a run, so that `isopod vm gc`
	// finds its VMM should this process die.
	id := newVMID()
	dir := s.opts.Paths.VM(id)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("creating vm directory: %w", err)
	}
	rec := &vmRecord{
		ID: id, Name: vanityName(id), Created: time.Now().UTC(), Argv: []string{"isopod", "warmpool", "build"},
		Base: pl.base.Flavor, Stage: BaseStage, OwnerPID: os.Getpid(), OwnerStartTime: procStartTime(os.Getpid()),
	}
	if err := writeRecord(dir, rec); err != nil {
		return nil, err
	}
	defer func() {
		rec.Finished = true
		writeRecord(dir, rec)
	}()
	con, err := os.OpenFile(filepath.Join(dir, "console.log"), os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating console log: %w", err)
	}
	serial := &cappedWriter{w: con, cap: SerialLogCap}
	defer serial.Close()
	n, err := s.startNetwork(id, dir, req, time.Now())
	if err != nil {
		return nil, err
	}
	defer n.close()
	meta, _, err := s.buildWarm(ctx, drv, in, warmBuild{
		id: id, dir: dir, serial: serial, net: n.vmmNet(), agentNet: n.agentConfig(), deadline: time.Now().Add(snapshotTimeout),
		started: func(m vmm.Machine) {
			rec.VMMPID, rec.VMMStartTime = m.Pid(), m.StartTime()
			writeRecord(dir, rec)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("warmpool build: %w (console: %s)", err, filepath.Join(dir, "console.log"))
	}
	res.Key, res.Built, res.BuildMS, res.Accel, res.Path = meta.Key, true, meta.BuildMS, meta.Accel, s.warmDir(meta.Key)
	return res, nil
}
