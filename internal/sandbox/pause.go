package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm"
	"isopod/internal/vmrecord"
	"isopod/internal/workspace"
)

// Pausing a held VM (a session's): its memory and device state are
// written to a directory (vmm.Snapshotter: a migration stream without RAM
// and a sparse copy of the VM's own RAM), its VMM and network end, and
// its disks (the scratch disk, the workspace's copy and layer, the slots'
// placeholders) stay in the VM's directory, whose record is marked paused
// so that nothing prunes it. ResumeVM restores the VM from there with RAM
// of its own again (vmm.Config.OwnRAM), so it can be paused again.

// pausedFile is the resume descriptor beside a pause's snapshot.
const pausedFile = "paused.json"

// PausedVM is what a pause leaves beside its snapshot for the resume.
type PausedVM struct {
	VMID    string `json:"vm_id"`
	Dir     string `json:"vm_dir"`
	Path    string `json:"path"`
	GuestIP string `json:"guest_ip,omitempty"`
	// Config is the VMM configuration the VM was started with, less its
	// NIC, console and logger (the resume's own).
	Config  vmm.Config `json:"config"`
	NIC     bool       `json:"nic"`
	Scratch string     `json:"scratch,omitempty"`
	// WorkspaceUpper is the workspace's writable layer, Workspace whether
	// the VM has a workspace copy (removed with the VM).
	WorkspaceUpper string   `json:"workspace_upper,omitempty"`
	Workspace      bool     `json:"workspace,omitempty"`
	Exec           ExecBase `json:"exec"`
	Identity       Identity `json:"identity"`
	// Fork: the VM is a copy of another (fork.go); its resume gives it a
	// boot id of its own besides the hygiene every resume does.
	Fork bool `json:"fork,omitempty"`
}

// Identity is what a paused VM's snapshot depends on: the VMM build, the
// guest kernel and initramfs files, the agent's protocol. A resume under
// another one is refused.
type Identity struct {
	VMM       string `json:"vmm"`
	Kernel    string `json:"kernel"`
	Initramfs string `json:"initramfs"`
	Agent     int    `json:"agent_protocol"`
}

// identity is the identity of a VM started with cfg, now.
func (s *Service) identity(ctx context.Context, cfg vmm.Config) (Identity, error) {
	rs, err := s.restorer(ctx)
	if err != nil {
		return Identity{}, err
	}
	id, err := rs.SnapshotIdentity(ctx)
	if err != nil {
		return Identity{}, err
	}
	return Identity{VMM: id.VMM, Kernel: fileIdentity(cfg.Kernel), Initramfs: fileIdentity(cfg.Initrd), Agent: agentproto.Version}, nil
}

// PauseResult is what a pause held.
type PauseResult struct {
	// MemoryBytes and DiskBytes are the bytes the snapshot's files and the
	// VM's disks occupy on disk (allocated blocks: holes are free).
	MemoryBytes int64
	DiskBytes   int64
}

// Pause writes the held VM's state into dir (new and empty), ends its VMM
// and network and keeps its disks for ResumeVM. The Held is closed then,
// whatever the outcome; on failure the VM is torn down as by Close.
func (h *Held) Pause(ctx context.Context, dir string) (*PauseResult, error) {
	r := h.r
	id, err := r.s.identity(ctx, r.vmCfg)
	if err != nil {
		return nil, err
	}
	if err := r.vm.Snapshot(ctx, dir, time.Time{}); err != nil {
		h.Close()
		return nil, fmt.Errorf("pausing the VM: %w", err)
	}
	p := h.descriptor(id)
	cfg := p.Config
	err = writePaused(dir, &p)
	if err == nil {
		// A pause outlives the host's page cache: a reboot keeps it.
		err = syncDir(dir)
	}
	for _, d := range cfg.Disks {
		if err == nil && !d.ReadOnly {
			err = syncFile(d.Path)
		}
	}
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("pausing the VM: %w", err)
	}
	r.paused = true
	h.Close()
	r.s.Wait()
	res := &PauseResult{MemoryBytes: allocated(dir)}
	for _, d := range cfg.Disks {
		if !d.ReadOnly {
			res.DiskBytes += allocated(d.Path)
		}
	}
	if p.WorkspaceUpper != "" {
		res.DiskBytes += allocated(p.WorkspaceUpper)
	}
	return res, nil
}

// descriptor is what a resume of the held VM, paused now, needs.
func (h *Held) descriptor(id Identity) PausedVM {
	r := h.r
	cfg := r.vmCfg
	cfg.Net, cfg.SerialLog, cfg.Logger, cfg.Paused, cfg.OwnRAM = nil, nil, nil, false, false
	return PausedVM{VMID: r.dir.Rec.ID, Dir: r.dir.Path(), Path: r.rep.Path, GuestIP: r.rep.GuestIP,
		Config: cfg, NIC: r.vm.Net != nil, Scratch: r.scratch, WorkspaceUpper: r.wsUpper,
		Workspace: r.ws != nil || r.req.Workspace != nil, Exec: h.ExecBase(), Identity: id}
}

// writePaused writes p as dir's resume descriptor.
func writePaused(dir string, p *PausedVM) error {
	b, _ := json.MarshalIndent(p, "", "  ")
	return os.WriteFile(filepath.Join(dir, pausedFile), b, 0o600)
}

// HeldBytes is, at most, what a pause of the held VM would hold on disk:
// its RAM and what its writable disks occupy now.
func (h *Held) HeldBytes() int64 {
	r := h.r
	n := int64(r.vmCfg.MemMiB) << 20
	for _, d := range r.vmCfg.Disks {
		if !d.ReadOnly {
			n += allocated(d.Path)
		}
	}
	if r.wsUpper != "" {
		n += allocated(r.wsUpper)
	}
	return n
}

// syncDir flushes the files in dir and dir itself to disk.
func syncDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range append(ents, nil) {
		path := dir
		if e != nil {
			path = filepath.Join(dir, e.Name())
		}
		if err := syncFile(path); err != nil {
			return err
		}
	}
	return nil
}

// syncFile flushes the file or directory at path to disk.
func syncFile(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	f.Close()
	if err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	return nil
}

// allocated is the bytes the file or directory at path occupies on disk.
func allocated(path string) int64 {
	var n int64
	filepath.Walk(path, func(_ string, fi os.FileInfo, err error) error {
		if err == nil {
			if st, ok := fi.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
		return nil
	})
	return n
}

// ReadPaused reads the resume descriptor a pause left in dir.
func ReadPaused(dir string) (*PausedVM, error) {
	b, err := os.ReadFile(filepath.Join(dir, pausedFile))
	if err != nil {
		return nil, fmt.Errorf("reading the paused VM's descriptor: %w: %w", err, errdefs.ErrNotFound)
	}
	var p PausedVM
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("reading the paused VM's descriptor: %w", err)
	}
	return &p, nil
}

// ErrChanged marks a paused VM that cannot be resumed because what its
// snapshot depends on changed since the pause (Identity).
var ErrChanged = errors.New("changed since the pause")

// PausedChanged says why the paused VM in dir cannot be resumed any more
// (its VMM, kernel, initramfs or agent changed since), "" when it can.
func (s *Service) PausedChanged(ctx context.Context, dir string) string {
	p, err := ReadPaused(dir)
	if err != nil {
		return err.Error()
	}
	now, err := s.identity(ctx, p.Config)
	if err != nil {
		return ""
	}
	return changed(p.Identity, now)
}

func changed(was, now Identity) string {
	switch {
	case was.VMM != now.VMM:
		return fmt.Sprintf("the VMM changed since the pause (%s, now %s)", was.VMM, now.VMM)
	case was.Kernel != now.Kernel:
		return fmt.Sprintf("the guest kernel changed since the pause (%s, now %s)", was.Kernel, now.Kernel)
	case was.Initramfs != now.Initramfs:
		return fmt.Sprintf("the guest initramfs (agent) changed since the pause (%s, now %s)", was.Initramfs, now.Initramfs)
	case was.Agent != now.Agent:
		return fmt.Sprintf("the agent protocol changed since the pause (%d, now %d)", was.Agent, now.Agent)
	}
	return ""
}

// DiscardPaused removes what a pause kept of the VM whose snapshot is in
// dir (its disks, its workspace copy) and finishes its record; the
// snapshot directory is the caller's.
func DiscardPaused(dir string) {
	p, err := ReadPaused(dir)
	if err != nil {
		return
	}
	discard(p)
}

// discard removes what was kept of the paused VM p and finishes its
// record.
func discard(p *PausedVM) {
	machine.CleanDisks(p.Dir, p.Scratch)
	if p.WorkspaceUpper != "" {
		os.Remove(p.WorkspaceUpper)
	}
	if p.Workspace {
		workspace.RemoveWork(p.VMID)
	}
	if rec, err := vmrecord.Read(p.Dir); err == nil {
		rec.Paused, rec.Finished = false, true
		vmrecord.Write(p.Dir, rec)
	}
}
