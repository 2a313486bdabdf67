package qemu

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/vmm"
)

// accelProbes are the host checks behind accel selection, injectable for
// tests.
type accelProbes struct {
	// env returns the accelerator forced by the settings ($ISOPOD_ACCEL).
	env func() string
	// facts reads what the host says of KVM: the CPU's flags, /dev/kvm
	// and who may open it.
	facts func() kvmFacts
	// bootKVM reports whether QEMU can run a guest under KVM (see
	// Driver.probeKVM). Called only when the facts do not rule KVM out.
	bootKVM func(ctx context.Context) error
}

// accelChoice is the outcome of selectAccel.
type accelChoice struct {
	Accel vmm.Accel
	// Reason says why, in whole sentences (logged as accel_reason).
	Reason string
}

// selectAccel picks the accelerator: $ISOPOD_ACCEL forces one, then the
// config's; auto means KVM when nothing the host says rules it out and a
// probe guest boots with it, else TCG. A forced KVM that /dev/kvm cannot
// serve is an error.
func selectAccel(ctx context.Context, want vmm.Accel, p accelProbes) (accelChoice, error) {
	source := "the configuration"
	if env := strings.TrimSpace(p.env()); env != "" {
		switch vmm.Accel(env) {
		case vmm.AccelKVM, vmm.AccelTCG:
			want, source = vmm.Accel(env), knobs.Accel+"="+env
		default:
			return accelChoice{}, fmt.Errorf("qemu: %s=%q: use kvm or tcg, or unset it for auto: %w",
				knobs.Accel, env, errdefs.ErrInvalidArgument)
		}
	}
	switch want {
	case vmm.AccelTCG:
		return accelChoice{vmm.AccelTCG, sentence(source + " forces TCG")}, nil
	case vmm.AccelKVM:
		f := p.facts()
		if why := f.obstacle(); why != "" {
			return accelChoice{}, fmt.Errorf("qemu: %s forces kvm, but KVM cannot be used: %s; use tcg or fix that: %w",
				source, why, errdefs.ErrNotSupported)
		}
		return accelChoice{vmm.AccelKVM, sentence(source + " forces KVM")}, nil
	case vmm.AccelAuto:
	default:
		return accelChoice{}, fmt.Errorf("qemu: unknown accel %q (want kvm, tcg or empty): %w", want, errdefs.ErrInvalidArgument)
	}
	f := p.facts()
	if why := f.obstacle(); why != "" {
		return accelChoice{vmm.AccelTCG, sentence("KVM cannot be used, so guests run under TCG: " + why)}, nil
	}
	if err := p.bootKVM(ctx); err != nil {
		if ctx.Err() != nil {
			return accelChoice{}, fmt.Errorf("qemu: probing kvm: %w: %w", errdefs.ErrUnavailable, ctx.Err())
		}
		why := fmt.Sprintf("QEMU could not run a probe guest under KVM (%v), so guests run under TCG", err)
		if cpu := f.cpuNote(); cpu != "" {
			why += "; " + cpu
		}
		return accelChoice{vmm.AccelTCG, sentence(why)}, nil
	}
	return accelChoice{vmm.AccelKVM, "KVM works: a probe guest booted under it."}, nil
}

// snapshotReason says why a restore runs under the snapshot's accelerator.
func snapshotReason(a vmm.Accel) string {
	return fmt.Sprintf("Resumed from a snapshot made under %s: a snapshot resumes only under the accelerator it was made with.", strings.ToUpper(string(a)))
}

// sentence makes s one: a capital first letter and a full stop.
func sentence(s string) string {
	s = strings.TrimSpace(s)
	if s == "" {
		return s
	}
	s = strings.ToUpper(s[:1]) + s[1:]
	if !strings.HasSuffix(s, ".") {
		s += "."
	}
	return s
}

// openDevKVM opens /dev/kvm read-write and closes it.
func openDevKVM() error {
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	return f.Close()
}

// hostTSCKHz returns the host TSC frequency in kHz, or 0 when unknown. Under
// TCG the guest TSC runs at the host's rate.
func hostTSCKHz() uint64 {
	if b, err := os.ReadFile("/sys/devices/system/cpu/cpu0/tsc_freq_khz"); err == nil {
		if v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64); err == nil && v > 0 {
			return v
		}
	}
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return cpuinfoKHz(b)
}

// cpuinfoKHz reads the first "cpu MHz" line of /proc/cpuinfo as kHz.
func cpuinfoKHz(cpuinfo []byte) uint64 {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(k) != "cpu MHz" {
			continue
		}
		mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || mhz <= 0 {
			return 0
		}
		return uint64(mhz*1000 + 0.5)
	}
	return 0
}
