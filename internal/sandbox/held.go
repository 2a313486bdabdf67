package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
)

// A held VM is one that outlives the call that started it (a session's):
// StartVM admits, plans and boots it exactly as Run does (the request's
// checks, the warm pool, the network, the workspace, the jail), marks its
// agent connection a session's, and hands it back; its execs run one
// after another through Held.Exec until Close.

// Held is a VM started by StartVM. Its methods are safe for concurrent
// use; execs and the other agent calls share its one connection.
type Held struct {
	r    *run
	once sync.Once
}

// HeldInfo says what a held VM is.
type HeldInfo struct {
	VMID         string   `json:"vm_id"`
	Name         string   `json:"name"`
	Path         string   `json:"path"` // "cold" or "warm"
	BootMS       *int64   `json:"boot_ms,omitempty"`
	ResumeMS     *int64   `json:"resume_ms,omitempty"`
	TotalMS      int64    `json:"total_ms,omitempty"` // a resume's whole call (ResumeVM)
	GuestIP      string   `json:"guest_ip,omitempty"`
	RootfsFlavor string   `json:"rootfs_flavor"`
	Warnings     []string `json:"warnings,omitempty"`
	SerialLog    string   `json:"serial_log_path"`
}

// heldArgv stands for a held VM's command in its record.
var heldArgv = []string{"(session)"}

// checkHeld refuses what belongs to a run's one command.
func checkHeld(req Request) error {
	if len(req.Argv) > 0 || req.Stdin != nil || len(req.CopyOut) > 0 || req.CommitAs != "" {
		return invalid("a held VM takes no command, stdin, copy-out or commit: give them to its execs")
	}
	if req.Workspace != nil && req.Workspace.Out != "" {
		return invalid("a held VM brings no workspace patch back: drop --workspace-out")
	}
	return nil
}

// CheckVM refuses, without starting anything, what StartVM would refuse
// before its VM starts: the request's fields, its base or stage, its
// workspace directory, its credentials.
func (s *Service) CheckVM(ctx context.Context, req Request) error {
	if err := checkHeld(req); err != nil {
		return err
	}
	req.Argv = heldArgv
	req, _, _, err := s.admit(ctx, req)
	if err != nil {
		return err
	}
	req.Workspace.Release()
	return nil
}

// StartVM boots a VM for req as Run would and keeps it. req.Argv, Stdin,
// CopyOut and CommitAs belong to a run's one command and are refused;
// req.TimeoutS bounds the boot. The caller must Close the result.
func (s *Service) StartVM(ctx context.Context, req Request) (_ *Held, retErr error) {
	if err := checkHeld(req); err != nil {
		return nil, err
	}
	req.Argv = heldArgv
	t0 := time.Now()
	req, pl, _, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	r := &run{s: s, req: req, t0: t0, plan: pl, vm: machine.New(s.log), ownRAM: true}
	r.warm = s.warmFor(ctx, req, pl)
	h := &Held{r: r}
	defer func() {
		if retErr != nil {
			h.Close()
		}
	}()
	if err := r.prepare(); err != nil {
		return nil, err
	}
	if err := r.packWorkspace(ctx); err != nil {
		r.unrecord = true
		return nil, err
	}
	if err := r.boot(ctx); err != nil {
		return nil, heldBootErr(err)
	}
	if err := r.configure(ctx); err != nil {
		return nil, heldBootErr(err)
	}
	if err := r.vm.Session(ctx); err != nil {
		return nil, fmt.Errorf("marking the VM's connection a session's: %w", err)
	}
	return h, nil
}

func heldBootErr(err error) error {
	if errors.Is(err, errBootTimeout) {
		return fmt.Errorf("the VM was not ready within its boot timeout; raise --timeout-s: %w", errdefs.ErrUnavailable)
	}
	return err
}

// Info describes the held VM.
func (h *Held) Info() HeldInfo {
	rep := h.r.rep
	return HeldInfo{VMID: rep.VMID, Name: rep.Name, Path: rep.Path, BootMS: rep.BootMS, ResumeMS: rep.ResumeMS, TotalMS: rep.TotalMS,
		GuestIP: rep.GuestIP, RootfsFlavor: rep.RootfsFlavor, Warnings: rep.Warnings, SerialLog: rep.SerialLogPath}
}

// Done is closed when the VMM has exited.
func (h *Held) Done() <-chan struct{} {
	m, _ := h.r.vm.Current()
	if m == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return m.Done()
}

// ExecBase is what every exec of the held VM starts from.
func (h *Held) ExecBase() pausefile.ExecBase {
	if p := h.r.resumedFrom; p != nil {
		return p.Exec
	}
	return pausefile.ExecBase{Env: h.r.spec().ExecEnv(nil), Cwd: cmp.Or(h.r.workspaceDir(), h.r.plan.cwd), LogDir: h.r.dir.Path()}
}

// Machine is the held VM, for its execs and the other agent calls.
func (h *Held) Machine() *machine.Machine { return h.r.vm }

// Died reports whether err, from a call into the guest, means the guest
// went away, and then why, as its console tells.
func (h *Held) Died(ctx context.Context, err error) (bool, string) {
	if !h.r.died(ctx, err) {
		return false, ""
	}
	return true, h.r.vm.Died(h.r.rep.SerialLogPath)
}

// Egress is the held VM's egress summary (a filtered VM's: its counts
// since it started or resumed, and its egress record, which a resumed
// session's VM continues), once Close returned; nil without one.
func (h *Held) Egress() any { return h.r.rep.Egress }

// Close kills the VMM and tears the VM down (in the background when the
// Service was told to; Service.Wait waits for it). Idempotent.
func (h *Held) Close() {
	h.once.Do(func() {
		h.r.stopCritical()
		h.r.s.teardown(h.r.cleanup)
	})
}
