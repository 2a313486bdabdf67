package machine

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/vmm"
)

// A VM's disks. A cold boot attaches only the disks the run uses. A
// snapshot VM attaches every slot a run could use (the base, MaxLayers
// layers, a scratch disk, a workspace and its writable layer), backed by
// empty placeholders it never mounts; each resumed QEMU, which starts with
// a command line of its own, backs the slots with that run's files. The
// guest learns which disks to mount from the Mount message and drops any
// sectors it cached of them first. A slot's size as the guest saw it at
// the snapshot is the placeholder's, SlotBytes, which is at least that of
// any file a run attaches (a file system never reaches past its own end).
const SlotBytes = int64(65536) << 20

// Disks are the files behind a VM's disks.
type Disks struct {
	Base    string
	Layers  []string // root first
	Scratch string   // a fresh ext4, the root's writable layer
	// Workspace is a squashfs of the host tree ("": none) and
	// WorkspaceUpper a fresh ext4, its writable layer.
	Workspace      string
	WorkspaceUpper string
}

// Cold lists only the disks the run uses.
func (d Disks) Cold() []vmm.Disk {
	out := []vmm.Disk{{Path: d.Base, ReadOnly: true, Serial: agentproto.SerialBase}}
	for i, l := range d.Layers {
		out = append(out, vmm.Disk{Path: l, ReadOnly: true, Serial: agentproto.LayerSerial(i)})
	}
	out = append(out, vmm.Disk{Path: d.Scratch, Serial: agentproto.SerialScratch})
	if d.Workspace != "" {
		out = append(out,
			vmm.Disk{Path: d.Workspace, ReadOnly: true, Serial: agentproto.SerialWorkspace},
			vmm.Disk{Path: d.WorkspaceUpper, Serial: agentproto.SerialWorkspaceUpper})
	}
	return out
}

// Slots lists every slot of a snapshot VM, in a fixed order with fixed
// read-only flags, each backed by the file in use or a placeholder: ph.RO
// for read-only slots (shared), and one of ph.RW for each writable slot the
// VM does not use (a writer needs a file of its own).
func (d Disks) Slots(ph SlotPlaceholders) []vmm.Disk {
	ro := ph.RO
	or := func(path, placeholder string) string {
		if path == "" {
			return placeholder
		}
		return path
	}
	out := []vmm.Disk{{Path: d.Base, ReadOnly: true, Serial: agentproto.SerialBase}}
	for i := 0; i < agentproto.MaxLayers; i++ {
		l := ""
		if i < len(d.Layers) {
			l = d.Layers[i]
		}
		out = append(out, vmm.Disk{Path: or(l, ro), ReadOnly: true, Serial: agentproto.LayerSerial(i)})
	}
	return append(out,
		vmm.Disk{Path: or(d.Scratch, ph.RW[0]), Serial: agentproto.SerialScratch},
		vmm.Disk{Path: or(d.Workspace, ro), ReadOnly: true, Serial: agentproto.SerialWorkspace},
		vmm.Disk{Path: or(d.WorkspaceUpper, ph.RW[1]), Serial: agentproto.SerialWorkspaceUpper})
}

// The writable slots' places in Slots.
const (
	slotScratch        = 1 + agentproto.MaxLayers
	slotWorkspaceUpper = 3 + agentproto.MaxLayers
)

// Mount is what the guest is told to assemble.
func (d Disks) Mount(workspaceDir string, flush bool, deadline time.Time) agentproto.Mount {
	m := agentproto.Mount{Layers: len(d.Layers), Scratch: d.Scratch != "", Flush: flush,
		WaitMS: max(time.Until(deadline).Milliseconds(), 1)}
	if d.Workspace != "" {
		m.Workspace = workspaceDir
	}
	return m
}

// placeholder makes a sparse file of size bytes at path, for a slot a VM
// attaches but never mounts.
func placeholder(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("making a placeholder disk: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return fmt.Errorf("making a placeholder disk: %w", err)
	}
	return nil
}

// SlotPlaceholders are the placeholder files of a VM: one its read-only
// slots share, and one per writable slot.
type SlotPlaceholders struct {
	RO string
	RW [2]string
}

// PlaceholderNames are the placeholder files in a VM's directory.
var PlaceholderNames = []string{"slot-ro.img", "slot-rw-0.img", "slot-rw-1.img"}

// Placeholders makes the placeholder files of a VM in dir that is
// restored from a snapshot, or cuts those there (a snapshot VM's, which
// ran in the directory before): empty. Its guest sees each slot as large
// as at the snapshot, but the VMM refuses a request past a file's end, so
// no write of the guest's reaches an unused slot, nor the host's disk.
func Placeholders(dir string) (SlotPlaceholders, error) { return placeholders(dir, 0) }

// SnapshotPlaceholders makes those of a VM in dir that may boot for a
// snapshot, or grows those there: each SlotBytes, the size its clones'
// guests then see. Before such a VM runs a run's command, FitSlots cuts
// the writable ones.
func SnapshotPlaceholders(dir string) (SlotPlaceholders, error) {
	return placeholders(dir, SlotBytes)
}

// CutPlaceholders empties the writable placeholders among a VM's disks
// before a VMM opens them again: a paused VM's, which a version of isopod
// that gave a clone placeholders of SlotBytes may have left.
func CutPlaceholders(disks []vmm.Disk) error {
	for _, d := range disks {
		if name := filepath.Base(d.Path); d.ReadOnly || !slices.Contains(PlaceholderNames[1:], name) {
			continue
		}
		if err := os.Truncate(d.Path, 0); err != nil {
			return fmt.Errorf("emptying a placeholder disk: %w", err)
		}
	}
	return nil
}

func placeholders(dir string, size int64) (SlotPlaceholders, error) {
	var paths []string
	for _, name := range PlaceholderNames {
		p := filepath.Join(dir, name)
		paths = append(paths, p)
		if st, err := os.Stat(p); err == nil {
			if st.Size() == size {
				continue
			}
			if err := os.Truncate(p, size); err != nil {
				return SlotPlaceholders{}, fmt.Errorf("resizing a placeholder disk: %w", err)
			}
			continue
		}
		if err := placeholder(p, size); err != nil {
			return SlotPlaceholders{}, err
		}
	}
	return SlotPlaceholders{RO: paths[0], RW: [2]string{paths[1], paths[2]}}, nil
}

// Cmdline is the guest kernel command line of a VM named hostname.
func Cmdline(hostname string) string {
	args := []string{
		"console=ttyS0", "reboot=t", "panic=-1", "quiet", "loglevel=4",
		"i8042.noaux", "i8042.nomux", "i8042.nopnp", "i8042.dumbkbd",
		"8250.nr_uarts=1", "random.trust_cpu=on",
		// No pressure-stall accounting on every context switch.
		"psi=0",
		// The kernel hands init the key=value parameters it does not know
		// as its environment. The agent only waits on I/O, and signals
		// that preempt it cost more than they give; its children start
		// from an environment of their own.
		"GODEBUG=asyncpreemptoff=1",
		agentproto.CmdlineHostname + "=" + hostname,
	}
	return strings.Join(args, " ")
}
