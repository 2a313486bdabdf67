// Package pausefile is what a paused VM leaves on disk beside its
// snapshot: its descriptor (Paused), what its snapshot depends on
// (Identity), the flush that makes a pause outlive a reboot, and the
// copies a fork makes of it (copy.go). It runs no VM: the machine layer
// writes and restores the snapshot (machine.Machine.Pause, ResumePaused).
package pausefile

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"syscall"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// A paused VM's memory and device state are in a directory (vmm.Snapshotter:
// a migration stream without RAM and the VM's own RAM, its RAM file itself
// where it has one, vmm.Config.RAMFile, else a sparse copy) beside its
// descriptor (Paused); its disks (the scratch disk, the
// workspace's copy and layer, the slots' placeholders) stay in the VM's
// directory. All of it is on disk, not only in the host's page cache,
// before the pause is done (Paused.Sync). A resume restores the VM from
// there with RAM of its own again (vmm.Config.OwnRAM), so it can be
// paused again.

// File is the descriptor beside a pause's snapshot.
const File = "paused.json"

// ExecBase is what every exec of a held VM starts from.
type ExecBase struct {
	Env    []string `json:"env,omitempty"` // the VM's environment, before the exec's own
	Cwd    string   `json:"cwd,omitempty"` // the workspace, else the base's working directory
	LogDir string   `json:"log_dir"`       // where exec logs go, beside the VM's record
}

// Paused is what a pause leaves beside its snapshot for the resume.
type Paused struct {
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
	// Fork: the VM is a copy of another (copy.go); its resume gives
	// it a boot id of its own besides the hygiene every resume does.
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

// ErrChanged marks a paused VM that cannot be resumed because what its
// snapshot depends on changed since the pause (Identity).
var ErrChanged = errors.New("changed since the pause")

// Changed says what differs between the identity at the pause, was, and
// now, "" when nothing does.
func (was Identity) Changed(now Identity) string {
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

// Sync flushes the pause in dir (its snapshot and descriptor, and dir
// itself) and the VM's writable disks to disk, all at once: a pause
// outlives the host's page cache.
func (p *Paused) Sync(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	paths := []string{dir}
	for _, e := range ents {
		paths = append(paths, filepath.Join(dir, e.Name()))
	}
	for _, d := range p.Config.Disks {
		if !d.ReadOnly && !slices.Contains(paths, d.Path) {
			paths = append(paths, d.Path)
		}
	}
	errs := make([]error, len(paths))
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Go(func() { errs[i] = syncFile(path) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Bytes are what the pause in dir holds on disk: its snapshot's files,
// and the VM's writable disks and workspace layer (allocated blocks:
// holes are free).
func (p *Paused) Bytes(dir string) (memory, disks int64) {
	for _, d := range p.Config.Disks {
		if !d.ReadOnly {
			disks += Allocated(d.Path)
		}
	}
	if p.WorkspaceUpper != "" {
		disks += Allocated(p.WorkspaceUpper)
	}
	return Allocated(dir), disks
}

// HeldBytes is, at most, what a pause of a VM started with cfg would hold
// on disk: its RAM and what its writable disks and workspace layer
// (upper) occupy now.
func HeldBytes(cfg vmm.Config, upper string) int64 {
	n := int64(cfg.MemMiB) << 20
	for _, d := range cfg.Disks {
		if !d.ReadOnly {
			n += Allocated(d.Path)
		}
	}
	if upper != "" {
		n += Allocated(upper)
	}
	return n
}

// Write writes p as dir's descriptor.
func Write(dir string, p *Paused) error {
	b, _ := json.MarshalIndent(p, "", "  ")
	return os.WriteFile(filepath.Join(dir, File), b, 0o600)
}

// Read reads the descriptor a pause left in dir.
func Read(dir string) (*Paused, error) {
	b, err := os.ReadFile(filepath.Join(dir, File))
	if err != nil {
		return nil, fmt.Errorf("reading the paused VM's descriptor: %w: %w", err, errdefs.ErrNotFound)
	}
	var p Paused
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, fmt.Errorf("reading the paused VM's descriptor: %w", err)
	}
	return &p, nil
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

// Allocated is the bytes the file or directory at path occupies on disk.
func Allocated(path string) int64 {
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
