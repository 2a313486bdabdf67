package sandbox

import (
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
