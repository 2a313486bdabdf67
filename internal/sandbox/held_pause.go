package sandbox

import (
	"context"
	"path/filepath"

	"isopod/internal/agentproto"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
	"isopod/internal/vmm"
)

// What the core knows of a held VM's pause and fork: its identity and its
// descriptor. The pause's and the fork's mechanics are the machine
// layer's and pausefile's (machine.Machine.Pause,
// pausefile.Paused.CopyFiles), their order the session supervisor's.

// identity is the identity of a VM started with cfg, now.
func (s *Service) identity(ctx context.Context, cfg vmm.Config) (pausefile.Identity, error) {
	rs, err := s.restorer(ctx)
	if err != nil {
		return pausefile.Identity{}, err
	}
	id, err := rs.SnapshotIdentity(ctx)
	if err != nil {
		return pausefile.Identity{}, err
	}
	return pausefile.Identity{VMM: id.VMM, Kernel: fileIdentity(cfg.Kernel), Initramfs: fileIdentity(cfg.Initrd),
		Agent: agentproto.Version}, nil
}

// Paused is what a resume of the held VM, paused or forked now, needs.
func (h *Held) Paused(ctx context.Context) (*pausefile.Paused, error) {
	r := h.r
	id, err := r.s.identity(ctx, r.vmCfg)
	if err != nil {
		return nil, err
	}
	cfg := r.vmCfg
	cfg.Net, cfg.SerialLog, cfg.Logger, cfg.Paused, cfg.OwnRAM, cfg.RAMCopy = nil, nil, nil, false, false, false
	// The resume maps the pause's RAM as the VM's own file, in its
	// directory: a later pause takes that file in place.
	cfg.RAMFile = filepath.Join(r.dir.Path(), machine.RAMFile)
	return &pausefile.Paused{VMID: r.dir.Rec.ID, Dir: r.dir.Path(), Path: r.rep.Path, GuestIP: r.rep.GuestIP,
		Config: cfg, NIC: r.vm.Net != nil, Scratch: r.scratch, WorkspaceUpper: r.wsUpper,
		Workspace: r.ws != nil || r.req.Workspace != nil, Exec: h.ExecBase(), Identity: id}, nil
}

// ClosePaused tears the held VM down after its pause (machine.Machine.Pause)
// but for what the pause kept (its disks, its workspace copy), marking its
// record paused so that nothing prunes it, and waits for the teardown.
func (h *Held) ClosePaused() {
	h.r.paused = true
	h.Close()
	h.r.s.Wait()
}

// HeldBytes is, at most, what a pause of the held VM would hold on disk:
// its RAM and what its writable disks occupy now.
func (h *Held) HeldBytes() int64 { return pausefile.HeldBytes(h.r.vmCfg, h.r.wsUpper) }

// PausedChanged says why the paused VM in dir cannot be resumed any more
// (its VMM, kernel, initramfs or agent changed since), "" when it can.
func (s *Service) PausedChanged(ctx context.Context, dir string) string {
	p, err := pausefile.Read(dir)
	if err != nil {
		return err.Error()
	}
	now, err := s.identity(ctx, p.Config)
	if err != nil {
		return ""
	}
	return p.Identity.Changed(now)
}
