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
	// openKVM reports whether /dev/kvm opens read-write.
	openKVM func() error
	// bootKVM reports whether QEMU can run a guest under KVM (see
	// Driver.probeKVM). Called only when openKVM succeeded.
	bootKVM func(ctx context.Context) error
}

// accelChoice is the outcome of selectAccel.
type accelChoice struct {
	Accel  vmm.Accel
	Reason string // why, for the log
}

// selectAccel picks the accelerator: $ISOPOD_ACCEL forces one, then the
// config's; auto means KVM when /dev/kvm opens and QEMU can boot with it,
// else TCG. A forced KVM that /dev/kvm cannot serve is an error.
func selectAccel(ctx context.Context, want vmm.Accel, p accelProbes) (accelChoice, error) {
	source := "config"
	if env := strings.TrimSpace(p.env()); env != "" {
		switch vmm.Accel(env) {
		case vmm.AccelKVM, vmm.AccelTCG:
			want, source = vmm.Accel(env), "$"+knobs.Accel
		default:
			return accelChoice{}, fmt.Errorf("qemu: %s=%q: use kvm or tcg, or unset it for auto: %w",
				knobs.Accel, env, errdefs.ErrInvalidArgument)
		}
	}
	switch want {
	case vmm.AccelTCG:
		return accelChoice{vmm.AccelTCG, "forced by " + source}, nil
	case vmm.AccelKVM:
		if err := p.openKVM(); err != nil {
			return accelChoice{}, fmt.Errorf("qemu: kvm forced by %s but /dev/kvm is unusable (%v); use tcg or fix /dev/kvm access: %w",
				source, err, errdefs.ErrNotSupported)
		}
		return accelChoice{vmm.AccelKVM, "forced by " + source}, nil
	case vmm.AccelAuto:
	default:
		return accelChoice{}, fmt.Errorf("qemu: unknown accel %q (want kvm, tcg or empty): %w", want, errdefs.ErrInvalidArgument)
	}
	if err := p.openKVM(); err != nil {
		return accelChoice{vmm.AccelTCG, fmt.Sprintf("/dev/kvm unusable: %v", err)}, nil
	}
	if err := p.bootKVM(ctx); err != nil {
		if ctx.Err() != nil {
			return accelChoice{}, fmt.Errorf("qemu: probing kvm: %w: %w", errdefs.ErrUnavailable, ctx.Err())
		}
		return accelChoice{vmm.AccelTCG, fmt.Sprintf("qemu cannot run a guest with kvm: %v", err)}, nil
	}
	return accelChoice{vmm.AccelKVM, "kvm probe booted"}, nil
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
