package machine

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"isopod/internal/admission"
	"isopod/internal/vmm"
	"isopod/internal/vmnet"
)

// Ready is one restored, running VM waiting for a claim. The core makes it
// (ReadySpec.Make) and, once claimed, adopts it as its run's VM.
type Ready struct {
	Shape   Shape
	BuildID string // the snapshot's build
	Made    time.Time
	Dir     ReadyDir
	VM      *Machine
	NIC     *vmnet.NIC // nil without a NIC
	Scratch string
	VMM     vmm.Info
	// Place is what the VM holds until a run claims it (nil: nothing).
	Place *admission.Ticket
	// layers are the stage layer files the VM was made with, as they were
	// then: a stage removed since (and maybe pulled again) must not serve
	// a run with the file it had.
	layerPaths []string
	layers     []os.FileInfo
}

// ReadyDir is a ready VM's directory and record, the core's: Discard
// cleans the directory's disks and finishes the record.
type ReadyDir interface {
	Path() string
	Finish()
}

// NoteLayers takes the layer files' identities. Taken before the VMM opens
// them, a file replaced in between makes the VM stale, never a wrong match.
func (rv *Ready) NoteLayers(paths []string) error {
	for _, l := range paths {
		fi, err := os.Stat(l)
		if err != nil {
			return fmt.Errorf("a layer of a ready VM: %w", err)
		}
		rv.layerPaths, rv.layers = append(rv.layerPaths, l), append(rv.layers, fi)
	}
	return nil
}

// exited reports whether the ready VM's VMM is gone.
func (rv *Ready) exited() bool {
	m, _ := rv.VM.Current()
	if m == nil {
		return true
	}
	select {
	case <-m.Done():
		return true
	default:
		return false
	}
}

// layersCurrent reports whether each layer file the ready VM was made
// with is still the file at its path.
func (rv *Ready) layersCurrent() bool {
	for i, fi := range rv.layers {
		now, err := os.Stat(rv.layerPaths[i])
		if err != nil || !sameFile(fi, now) {
			return false
		}
	}
	return true
}

// sameFile reports whether a and b describe one file, unchanged: the same
// inode and change time (an inode number alone may be reused once the
// file is gone).
func sameFile(a, b os.FileInfo) bool {
	sa, okA := a.Sys().(*syscall.Stat_t)
	sb, okB := b.Sys().(*syscall.Stat_t)
	return os.SameFile(a, b) && okA && okB && sa.Ctim == sb.Ctim && a.Size() == b.Size()
}

// layersExist reports whether every layer file is there.
func layersExist(layers []string) bool {
	for _, l := range layers {
		if _, err := os.Stat(l); err != nil {
			return false
		}
	}
	return true
}

// Discard ends a ready VM that no run took: its VMM, its socket, its
// scratch disk and placeholders, its directory's record, and its place.
func (rv *Ready) Discard() {
	rv.VM.Close()
	if rv.NIC != nil {
		rv.NIC.Close()
	}
	CleanDisks(rv.Dir.Path(), rv.Scratch)
	rv.Dir.Finish()
	rv.Place.Release()
}

// RAMFile is the name of a session VM's guest RAM file in its VM
// directory (vmm.Config.RAMFile).
const RAMFile = "ram"

// CleanDisks removes a VM's scratch disk, slot placeholders and RAM file.
func CleanDisks(dir, scratch string) {
	os.Remove(filepath.Join(dir, RAMFile))
	if scratch != "" {
		os.Remove(scratch)
	}
	for _, f := range PlaceholderNames {
		os.Remove(filepath.Join(dir, f))
	}
}
