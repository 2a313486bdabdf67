package sandbox

import (
	"context"
	"path/filepath"
	"time"

	"isopod/internal/vmm/qemu"
)

// What `isopod doctor` (internal/doctor) learns from the core.

// probeCacheName is the file under the state root where the QEMU driver
// remembers whether KVM can run a guest on this host.
const probeCacheName = "accel-probe.json"

func (s *Service) probeCache() string { return filepath.Join(s.opts.Paths.Home, probeCacheName) }

// KVMProbe is the outcome of the last KVM probe under this state root.
type KVMProbe struct {
	KVM    bool // QEMU ran a guest under KVM
	Reason string
	At     time.Time
}

// LastKVMProbe returns the last KVM probe recorded under the state root
// (ok is false when none was): a /dev/kvm that opens is no proof that QEMU
// can run a guest with it. The probe itself runs with the first run.
func (s *Service) LastKVMProbe() (p KVMProbe, ok bool) {
	v, ok := qemu.LastProbe(s.probeCache())
	if !ok {
		return KVMProbe{}, false
	}
	return KVMProbe{KVM: v.KVM, Reason: v.Reason, At: v.At}, true
}

// QEMUMachine is how runs start the microvm machine of a QEMU binary:
// the machine options, the firmware and why (see qemu.ProbeMachine).
type QEMUMachine = qemu.MachineInfo

// ProbeQEMUMachine asks the QEMU binary bin which machine options and
// firmware a run would start it with.
func ProbeQEMUMachine(ctx context.Context, bin string) (QEMUMachine, error) {
	return qemu.ProbeMachine(ctx, bin)
}

// KVMObstacle says why this state root's VMMs (in their jail, unless it
// is off) cannot use KVM, and the fix; empty when nothing the host says
// rules it out.
func (s *Service) KVMObstacle(ctx context.Context) (why, fix string) {
	s.driver(ctx) // sets s.jailer; a jail that cannot be had is the jail check's
	return qemu.KVMObstacle(s.jailer)
}
