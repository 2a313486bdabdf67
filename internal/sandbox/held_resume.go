package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmnet"
	"isopod/internal/vmrecord"
)

// ResumeVM brings back the held VM a pause left in dir (Held.Pause): req
// is admitted again (its network rules, its credentials resolved anew;
// its workspace is not copied again: the VM keeps its copy), the same
// network is made again for the same VM, and the VM is restored with
// RAM of its own, its clock set to the host's and its network
// configured. The caller must Close or Pause the result. A VM whose
// VMM, kernel, initramfs or agent changed since the pause is refused,
// wrapping ErrChanged and errdefs.ErrFailedPrecondition.
func (s *Service) ResumeVM(ctx context.Context, req Request, dir string) (_ *Held, retErr error) {
	t0 := time.Now()
	p, err := ReadPaused(dir)
	if err != nil {
		return nil, err
	}
	now, err := s.identity(ctx, p.Config)
	if err != nil {
		return nil, err
	}
	if why := changed(p.Identity, now); why != "" {
		return nil, fmt.Errorf("%s: %w: %w", why, ErrChanged, errdefs.ErrFailedPrecondition)
	}
	if err := checkHeld(req); err != nil {
		return nil, err
	}
	req.Argv, req.Workspace = heldArgv, nil
	req, pl, _, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	d, err := vmrecord.Reopen(p.Dir)
	if err != nil {
		return nil, err
	}
	r := &run{s: s, req: req, t0: t0, plan: pl, vm: machine.New(s.log), dir: d, scratch: p.Scratch,
		wsUpper: p.WorkspaceUpper, resumedFrom: p}
	r.rep = &Report{OK: true, VMID: d.Rec.ID, Name: d.Rec.Name, Path: p.Path, GuestIP: p.GuestIP,
		SerialLogPath: d.ConsolePath(), Warnings: append(append([]string(nil), pl.warnings...), s.jailReport()...)}
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
	ms := time.Since(t0).Milliseconds()
	r.rep.ResumeMS = &ms
	return h, nil
}

// restorePaused starts the network and the VMM from the snapshot in dir
// and makes the guest current: its clock, its network, its connection a
// session's.
func (r *run) restorePaused(ctx context.Context, p *PausedVM, dir string) error {
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
	t := time.Now()
	m, err := r.vm.Restore(rctx, drv, cfg, dir)
	if err != nil {
		return fmt.Errorf("restoring the paused VM: %w", err)
	}
	tRestore := time.Since(t)
	r.rep.Accel = m.Accel()
	r.dir.Started(m)
	if err := r.vm.Greet(rctx); err != nil {
		return fmt.Errorf("greeting the resumed VM: %w", err)
	}
	// The clock jumps to the host's; entropy is mixed in; the network
	// (its proxies' credentials anew) is configured again.
	if _, err := r.vm.MakeOwn(rctx, r.dir.Rec.Name); err != nil {
		return err
	}
	if p.Fork {
		if err := r.vm.SetBootID(rctx, newBootID()); err != nil {
			return err
		}
	}
	if err := r.vm.Session(rctx); err != nil {
		return fmt.Errorf("marking the VM's connection a session's: %w", err)
	}
	r.s.log.Debug("paused VM resumed", "since_start_ms", time.Since(r.t0).Milliseconds(),
		"restore_ms", tRestore.Milliseconds(), "greet_configure_ms", (time.Since(t) - tRestore).Milliseconds())
	return nil
}

// newBootID is a random (version 4) UUID, as the kernel makes a boot id.
func newBootID() string {
	var b [16]byte
	rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
