package sandbox

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
	"isopod/internal/report"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
	"isopod/internal/vmrecord"
)

// ResumeVM brings back the held VM a pause left in dir
// (machine.Machine.Pause): req is admitted again (its network rules, its
// credentials resolved anew; its workspace is not copied again: the VM
// keeps its copy), the same network is made again for the same VM, and
// the VM is restored with RAM of its own (machine.Machine.ResumePaused).
// The caller must Close or pause the result. Its Info's ResumeMS spans
// the restore and the guest's hello, as a warm run's resume_ms does;
// TotalMS the whole call. A VM whose VMM, kernel, initramfs or agent
// changed since the pause is refused, wrapping pausefile.ErrChanged and
// errdefs.ErrFailedPrecondition, before anything else is.
func (s *Service) ResumeVM(ctx context.Context, req Request, dir string) (*Held, error) {
	t0 := time.Now()
	if _, err := s.pausedVM(ctx, dir); err != nil {
		return nil, err
	}
	a, err := s.AdmitResume(ctx, req)
	if err != nil {
		return nil, err
	}
	a.t0 = t0
	return a.Resume(ctx, dir)
}

// Resuming is a resume admitted before its pause is there: a fork's,
// admitted while its parent's VM is copied.
type Resuming struct {
	s   *Service
	req Request
	pl  *plan
	t0  time.Time
}

// AdmitResume admits req for a resume (as ResumeVM does) and makes ready
// what does not depend on the pause: the VMM's identity, asked once.
func (s *Service) AdmitResume(ctx context.Context, req Request) (*Resuming, error) {
	t0 := time.Now()
	if err := checkHeld(req); err != nil {
		return nil, err
	}
	req.Argv, req.Workspace = heldArgv, nil
	req, pl, _, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	if rs, err := s.restorer(ctx); err == nil {
		rs.SnapshotIdentity(ctx)
	}
	return &Resuming{s: s, req: req, pl: pl, t0: t0}, nil
}

// pausedVM reads the pause in dir, refusing one whose identity changed.
func (s *Service) pausedVM(ctx context.Context, dir string) (*pausefile.Paused, error) {
	p, err := pausefile.Read(dir)
	if err != nil {
		return nil, err
	}
	now, err := s.identity(ctx, p.Config)
	if err != nil {
		return nil, err
	}
	if why := p.Identity.Changed(now); why != "" {
		return nil, fmt.Errorf("%s: %w: %w", why, pausefile.ErrChanged, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// Resume restores the held VM a pause left in dir, as ResumeVM does.
func (a *Resuming) Resume(ctx context.Context, dir string) (_ *Held, retErr error) {
	s := a.s
	p, err := s.pausedVM(ctx, dir)
	if err != nil {
		return nil, err
	}
	d, err := vmrecord.Reopen(p.Dir)
	if err != nil {
		return nil, err
	}
	r := &run{s: s, req: a.req, t0: a.t0, plan: a.pl, vm: machine.New(s.log), dir: d, scratch: p.Scratch,
		wsUpper: p.WorkspaceUpper, resumedFrom: p}
	r.rep = &report.Run{OK: true, VMID: d.Rec.ID, Name: d.Rec.Name, Path: p.Path, GuestIP: p.GuestIP,
		SerialLogPath: d.ConsolePath(), Warnings: append(append([]string(nil), a.pl.warnings...), s.jailReport()...)}
	h := &Held{r: r}
	defer func() {
		if retErr != nil {
			// What the pause kept stays for another try.
			r.paused = true
			h.Close()
		}
	}()
	if err := r.restorePaused(ctx, p, dir); err != nil {
		return nil, err
	}
	r.rep.TotalMS = time.Since(a.t0).Milliseconds()
	return h, nil
}

// restorePaused starts the network and the VMM from the snapshot in dir
// and makes the guest current.
func (r *run) restorePaused(ctx context.Context, p *pausefile.Paused, dir string) error {
	if p.NIC != !r.req.NoNetwork {
		return fmt.Errorf("the paused VM's network (%v) is not the request's: %w", p.NIC, errdefs.ErrInvalidArgument)
	}
	if p.NIC {
		// The same network for the same VM: its flow log goes on, its
		// times counted from the VM's start.
		nc := r.s.netConfig(nil, p.VMID, p.Dir, r.req.rules, r.dir.Rec.Created, r.req.creds)
		nc.Continue = true
		n, err := vmnet.Start(nc)
		if err != nil {
			return err
		}
		r.vm.Net = n
	}
	drv, err := r.s.restorer(ctx)
	if err != nil {
		return err
	}
	cfg := p.Config
	cfg.ID, cfg.Dir, cfg.SerialLog, cfg.Logger, cfg.OwnRAM = p.VMID, p.Dir, r.dir.Serial, r.s.log, true
	r.vmCfg = cfg
	bound := time.Duration(max(r.req.TimeoutS, 1)) * time.Second
	rctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	resumed, restore, err := r.vm.ResumePaused(rctx, drv, cfg, dir, p.Fork, r.dir.Rec.Name, func(m vmm.Machine) {
		r.rep.Accel = m.Accel()
		r.dir.Started(m)
	})
	if err != nil {
		return err
	}
	ms := resumed.Milliseconds()
	r.rep.ResumeMS = &ms
	r.s.log.Debug("paused VM resumed", "since_start_ms", time.Since(r.t0).Milliseconds(),
		"restore_ms", restore.Milliseconds(), "resume_ms", ms)
	return nil
}
