package qemu

import (
	"context"
	"encoding/json"
	"os"
	"strings"

	"isopod/internal/vmm"
)

var _ vmm.Prober = (*Driver)(nil)

// AccelVerdict says whether guests can get KVM here: what the host says
// (the CPU's flags, /dev/kvm and whether the VMM's ids may open it) and
// the last probe guest the probe cache remembers (see Config.ProbeCache).
// That probe may be of another QEMU, kernel or host boot than the next
// run's, which probes again.
func (d *Driver) AccelVerdict(ctx context.Context) vmm.AccelVerdict {
	f := d.kvmFacts()
	v := vmm.AccelVerdict{Obstacle: sentence(f.obstacle()), Fix: sentence(f.fix())}
	if rec, ok := lastProbe(d.probeCache); ok {
		v.Probe = &vmm.AccelProbe{OK: rec.KVM, At: rec.At}
		if !rec.KVM {
			v.Probe.Reason = sentence("the probe guest failed: " + firstLine(rec.Reason))
		}
	}
	return v
}

// Machine says which QEMU runs guests and how isopod starts its microvm
// machine: the options and firmware, and why.
func (d *Driver) Machine(ctx context.Context) (vmm.MachineInfo, error) {
	info, err := d.Info(ctx)
	if err != nil {
		return vmm.MachineInfo{}, err
	}
	p, err := d.machine(ctx)
	if err != nil {
		return vmm.MachineInfo{Info: info}, err
	}
	return vmm.MachineInfo{Info: info, Options: p.Options, DataDirs: p.DataDirs,
		Firmware: p.Firmware, FirmwareKind: string(p.Kind), Why: p.Why}, nil
}

// lastProbe reads the probe cache file; ok is false when no probe was
// recorded there.
func lastProbe(cacheFile string) (rec probeRecord, ok bool) {
	if cacheFile == "" {
		return probeRecord{}, false
	}
	b, err := os.ReadFile(cacheFile)
	if err != nil {
		return probeRecord{}, false
	}
	if json.Unmarshal(b, &rec) != nil || rec.At.IsZero() {
		return probeRecord{}, false
	}
	return rec, true
}

// firstLine is the first non-empty line of s, trimmed.
func firstLine(s string) string {
	for l := range strings.Lines(s) {
		if l = strings.TrimSpace(l); l != "" {
			return l
		}
	}
	return ""
}
