package sandbox

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/jail"
	"isopod/internal/knobs"
	"isopod/internal/vmm"
	"isopod/internal/vmm/qemu"
)

// The one place the core names a VMM driver: Options.VMM (ISOPOD_VMM)
// picks one of vmmDrivers, and everything else speaks to it through the
// vmm contract. A second driver plugs in here, as one more entry.

// DefaultVMM is the VMM driver when Options.VMM is empty.
const DefaultVMM = "qemu"

// newDriverFunc makes a driver for the Service's options, its VMMs
// confined by j (nil: unconfined).
type newDriverFunc func(s *Service, j *jail.Jailer) (vmm.Driver, error)

// vmmDrivers are the drivers Options.VMM may name.
var vmmDrivers = map[string]newDriverFunc{
	"qemu": newQEMU,
}

// VMMDrivers names the drivers Options.VMM (ISOPOD_VMM) may select, sorted.
func VMMDrivers() []string { return slices.Sorted(maps.Keys(vmmDrivers)) }

// CheckVMM refuses a VMM driver name that is none of VMMDrivers, with an
// invalid-argument error naming the known ones; empty is DefaultVMM.
func CheckVMM(name string) error {
	if _, ok := vmmDrivers[name]; ok || name == "" {
		return nil
	}
	return fmt.Errorf("%s=%q: no such VMM driver; use %s, or unset it for %s: %w",
		knobs.VMM, name, strings.Join(VMMDrivers(), " or "), DefaultVMM, errdefs.ErrInvalidArgument)
}

// newDriver makes the driver Options.VMM selects, its VMMs confined by j
// (nil: unconfined).
func (s *Service) newDriver(j *jail.Jailer) (vmm.Driver, error) {
	name := s.opts.VMM
	if name == "" {
		name = DefaultVMM
	}
	if err := CheckVMM(name); err != nil {
		return nil, err
	}
	return vmmDrivers[name](s, j)
}

// probeCacheName is the file under the state root where the QEMU driver
// remembers whether KVM can run a guest on this host.
const probeCacheName = "accel-probe.json"

// factsCacheName is the file under the state root where the QEMU driver
// keeps what the QEMU binary says of itself and the libraries it loads.
const factsCacheName = "qemu-facts.json"

func newQEMU(s *Service, j *jail.Jailer) (vmm.Driver, error) {
	return qemu.New(qemu.Config{
		Binary: s.opts.QEMU, Accel: s.opts.Accel, Logger: s.log,
		ProbeCache: filepath.Join(s.opts.Paths.Home, probeCacheName),
		FactsCache: filepath.Join(s.opts.Paths.Home, factsCacheName),
		Jail:       j,
	})
}
