// Package doctor checks whether this host can run isopod and says, for
// each thing it cannot do, why and what to run: the checks behind
// `isopod doctor`. Every host fact comes through a [Host], so the checks
// are tested without the host; [System] is the real one.
//
// Required checks (a run fails without them): QEMU, the jail (or
// ISOPOD_JAIL=off), mkfs.ext4 (the tools check), the guest kernel, the
// initramfs, one base image, disk space. The others (KVM, the guest agent,
// each base, the warm pool, the tools besides mkfs.ext4) say what is
// slower or missing but do not stop a run.
package doctor

import (
	"context"
	"fmt"
	"strings"

	"isopod/internal/errdefs"
)

// Check is one finding.
type Check struct {
	Name string `json:"name"`
	OK   bool   `json:"ok"`
	// Required: isopod cannot run a command while this check fails.
	Required bool `json:"required"`
	// Why says what was found, in a sentence, whether OK or not.
	Why string `json:"why"`
	// Fix is what to run or change; empty when OK (or nothing will help).
	Fix string `json:"fix,omitempty"`
	// Detail holds the facts behind Why, for programs.
	Detail map[string]any `json:"detail,omitempty"`
}

// Report is every check, in a fixed order.
type Report struct {
	// OK: every required check passed.
	OK bool `json:"ok"`
	// Error and Class are set when a required check failed, as in every
	// failed isopod command's JSON.
	Error string `json:"error,omitempty"`
	Class string `json:"class,omitempty"`
	// Version is isopod's.
	Version string `json:"version"`
	// Home is the state root checked.
	Home string `json:"home"`
	// Accel is what a run here boots with: kvm or tcg.
	Accel  string  `json:"accel"`
	Checks []Check `json:"checks"`
}

// Failed names the required checks that failed.
func (r *Report) Failed() []string {
	var out []string
	for _, c := range r.Checks {
		if c.Required && !c.OK {
			out = append(out, c.Name)
		}
	}
	return out
}

// Config is what the checks are about.
type Config struct {
	Version string
	// Home is the state root ($ISOPOD_HOME).
	Home string
	// QEMU is the VMM binary set by ISOPOD_QEMU; empty: DefaultQEMU on PATH.
	QEMU string
	// Accel is the accelerator ISOPOD_ACCEL forces: "kvm", "tcg" or "".
	Accel string
	// JailOff: ISOPOD_JAIL=off, VMMs run unconfined.
	JailOff bool
	// Kernel is a custom kernel (--kernel, ISOPOD_KERNEL); "" the fetched one.
	Kernel string
	// MinFreeBytes is the least free space under Home that passes;
	// default DefaultMinFreeBytes.
	MinFreeBytes uint64
}

// DefaultQEMU is the QEMU looked up on PATH.
const DefaultQEMU = "qemu-system-x86_64"

// MinQEMU is the oldest QEMU isopod is tested with (Debian 12's).
var MinQEMU = [2]int{7, 2}

// DefaultMinFreeBytes is enough for base-debian's build (its unpacked tree
// and image) and a few runs' scratch disks and logs.
const DefaultMinFreeBytes = 2 << 30

// Run runs every check against h. It never fails: a fact that cannot be
// read fails its check.
func Run(ctx context.Context, cfg Config, h Host) *Report {
	if cfg.MinFreeBytes == 0 {
		cfg.MinFreeBytes = DefaultMinFreeBytes
	}
	r := &Report{Version: cfg.Version, Home: cfg.Home}
	kvm := checkKVM(ctx, cfg, h)
	r.Accel = "tcg"
	if kvm.OK {
		r.Accel = "kvm"
	}
	r.Checks = append(r.Checks, checkQEMU(ctx, cfg, h), kvm, checkJail(ctx, cfg, h), checkTools(h))
	r.Checks = append(r.Checks, checkImages(cfg, h)...)
	r.Checks = append(r.Checks, checkDisk(cfg, h), checkWarmPool(ctx, h))
	failed := r.Failed()
	r.OK = len(failed) == 0
	if !r.OK {
		r.Error = fmt.Sprintf("isopod cannot run commands on this host yet: %s failed; each check's fix says what to do", strings.Join(failed, ", "))
		r.Class = errdefs.Class(errdefs.ErrFailedPrecondition)
	}
	return r
}
