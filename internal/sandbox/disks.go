package sandbox

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/vmm"
)

// A run's disks. A cold boot attaches only the disks the run uses. A
// snapshot VM attaches every slot a run could use (the base, MaxLayers
// layers, a scratch disk, a workspace and its writable layer), backed by
// empty placeholders it never mounts; each resumed QEMU, which starts with
// a command line of its own, backs the slots with that run's files. The
// guest learns which disks to mount from the Mount message and drops any
// sectors it cached of them first. A slot's size as the guest saw it at
// the snapshot is the placeholder's, slotBytes, which is at least that of
// any file a run attaches (a file system never reaches past its own end).
const slotBytes = int64(MaxScratchMiB) << 20

// runDisks are the files behind a run's disks.
type runDisks struct {
	base    string
	layers  []string // root first
	scratch string   // a fresh ext4, the root's writable layer
	// workspace is a squashfs of the host tree ("": none) and
	// workspaceUpper a fresh ext4, its writable layer.
	workspace      string
	workspaceUpper string
}

// cold lists only the disks the run uses.
func (d runDisks) cold() []vmm.Disk {
	out := []vmm.Disk{{Path: d.base, ReadOnly: true, Serial: agentproto.SerialBase}}
	for i, l := range d.layers {
		out = append(out, vmm.Disk{Path: l, ReadOnly: true, Serial: agentproto.LayerSerial(i)})
	}
	out = append(out, vmm.Disk{Path: d.scratch, Serial: agentproto.SerialScratch})
	if d.workspace != "" {
		out = append(out,
			vmm.Disk{Path: d.workspace, ReadOnly: true, Serial: agentproto.SerialWorkspace},
			vmm.Disk{Path: d.workspaceUpper, Serial: agentproto.SerialWorkspaceUpper})
	}
	return out
}

// slots lists every slot of a snapshot VM, in a fixed order with fixed
// read-only flags, each backed by the run's file or a placeholder: ph.ro
// for read-only slots (shared), and one of ph.rw for each writable slot the
// run does not use (a writer needs a file of its own).
func (d runDisks) slots(ph slotPlaceholders) []vmm.Disk {
	ro := ph.ro
	or := func(path, placeholder string) string {
		if path == "" {
			return placeholder
		}
		return path
	}
	out := []vmm.Disk{{Path: d.base, ReadOnly: true, Serial: agentproto.SerialBase}}
	for i := 0; i < agentproto.MaxLayers; i++ {
		l := ""
		if i < len(d.layers) {
			l = d.layers[i]
		}
		out = append(out, vmm.Disk{Path: or(l, ro), ReadOnly: true, Serial: agentproto.LayerSerial(i)})
	}
	return append(out,
		vmm.Disk{Path: or(d.scratch, ph.rw[0]), Serial: agentproto.SerialScratch},
		vmm.Disk{Path: or(d.workspace, ro), ReadOnly: true, Serial: agentproto.SerialWorkspace},
		vmm.Disk{Path: or(d.workspaceUpper, ph.rw[1]), Serial: agentproto.SerialWorkspaceUpper})
}

// mount is what the guest is told to assemble.
func (d runDisks) mount(workspaceDir string, flush bool, deadline time.Time) agentproto.Mount {
	m := agentproto.Mount{Layers: len(d.layers), Scratch: d.scratch != "", Flush: flush,
		WaitMS: max(time.Until(deadline).Milliseconds(), 1)}
	if d.workspace != "" {
		m.Workspace = workspaceDir
	}
	return m
}

// placeholder makes an empty sparse file of slotBytes at path, for a slot
// a VM attaches but never mounts.
func placeholder(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("making a placeholder disk: %w", err)
	}
	err = f.Truncate(slotBytes)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("making a placeholder disk: %w", err)
	}
	return nil
}

// slotPlaceholders are the placeholder files of a VM: one its read-only
// slots share, and one per writable slot.
type slotPlaceholders struct {
	ro string
	rw [2]string
}

// placeholderNames are the placeholder files in a VM's directory.
var placeholderNames = []string{"slot-ro.img", "slot-rw-0.img", "slot-rw-1.img"}

// placeholders makes (once) the placeholder files of the VM in dir.
func placeholders(dir string) (slotPlaceholders, error) {
	var paths []string
	for _, name := range placeholderNames {
		p := filepath.Join(dir, name)
		paths = append(paths, p)
		if _, err := os.Stat(p); err == nil {
			continue
		}
		if err := placeholder(p); err != nil {
			return slotPlaceholders{}, err
		}
	}
	return slotPlaceholders{ro: paths[0], rw: [2]string{paths[1], paths[2]}}, nil
}
