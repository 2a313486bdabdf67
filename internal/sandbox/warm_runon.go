package sandbox

import (
	"fmt"
	"os"

	"isopod/internal/machine"
)

// A snapshot VM built inside a CLI run runs on as that run's VM once its
// snapshot is written (machine.Machine.SnapshotRunning), instead of being
// killed for a clone that the run would then restore: the run is spared
// a restore and a fresh VMM's first translation of the guest's paths. The
// VM is then one more clone of the snapshot, made its own as every clone
// is (configure: fresh entropy and a reseed, clock, hostname, network;
// its kernel makes its boot ID after the reseed).
//
// An assembled snapshot's VM has the run's root already (warm_assembled.go).
// A plain snapshot's VM has placeholders in its disk slots, which clones
// back with their own files; it runs on only for a run whose disks are
// the base and a scratch disk (no stage, no workspace), whose scratch disk
// then sits in the scratch slot from the boot on. The guest sees a slot as
// large as its file at the boot, and every clone must find the size its
// snapshot saw (machine.SlotBytes, the placeholders'), so that scratch
// file is grown to it (holes; the ext4 in it keeps its size) for the boot.
// Once the snapshot is written, and before the run's command, the VM's
// writable slots are cut to what the run may write (machine.FitSlots: the
// scratch disk to its own size, an unused slot's placeholder to nothing),
// so that its guest can fill no more of the host's disk than a clone's.
// A scratch disk left grown (the VM did not run on) is shrunk before the
// run resumes a clone or anything reads it as a layer (a commit).

// runOnPlain says whether the run's VM may be its shape's plain snapshot
// VM, and readies its scratch disk for the scratch slot if so.
func (r *run) runOnPlain() bool {
	if r.ownRAM || r.ws != nil || r.req.Workspace != nil || len(r.plan.layers) > 0 || r.scratch == "" {
		return false
	}
	st, err := os.Stat(r.scratch)
	if err != nil || st.Size() >= machine.SlotBytes {
		return false
	}
	if err := os.Truncate(r.scratch, machine.SlotBytes); err != nil {
		r.s.log.Debug("warm pool: the scratch disk cannot fill its slot; the run resumes", "err", err)
		os.Truncate(r.scratch, st.Size())
		return false
	}
	r.scratchBytes = st.Size()
	return true
}

// shrinkScratch gives a scratch disk grown for a slot (runOnPlain) its own
// size back; the VM must be gone or not use it.
func (r *run) shrinkScratch() error {
	if r.scratchBytes == 0 {
		return nil
	}
	if err := os.Truncate(r.scratch, r.scratchBytes); err != nil {
		return fmt.Errorf("the scratch disk: %w", err)
	}
	r.scratchBytes = 0
	return nil
}

// ranOn makes the snapshot VM, running on after its snapshot, the run's,
// with scratch its scratch disk and its root assembled or not: a clone of
// the plain snapshot (an assembled snapshot's VM) reports a resume, a
// booted one a boot, each as long as the VM took to answer.
func (r *run) ranOn(start buildStart, scratch string, assembled bool) {
	r.scratch, r.resumed = scratch, true
	r.rootAssembled, r.rep.RootAssembled = assembled, assembled
	ms := start.ms
	if start.cloned {
		r.rep.Path, r.rep.ResumeMS = "warm", &ms
	} else {
		r.rep.BootMS = &ms
	}
}
