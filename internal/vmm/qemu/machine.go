package qemu

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sync/errgroup"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// The microvm machine's firmware differs between the QEMUs users have:
// Debian 12's 7.2 boots microvm with qboot, which loads the kernel itself;
// Debian 13's 10.0 (and Debian 12's backport of it) boots it with SeaBIOS,
// which loads the kernel through an option ROM and stops at "No bootable
// device" when option ROMs are off. So the options are chosen by what the
// binary and its data directories say, asked once per Driver (three
// `-help` runs of QEMU, tens of milliseconds), never by its version.

// microvmFirmware is the file QEMU loads for microvm unless -bios names
// another.
const microvmFirmware = "bios-microvm.bin"

// firmwareKind is which firmware a file is.
type firmwareKind string

const (
	firmwareQboot   firmwareKind = "qboot"
	firmwareSeaBIOS firmwareKind = "SeaBIOS"
	firmwareUnknown firmwareKind = "unknown"
)

// machineFacts is what a QEMU binary and its data directories say about
// the microvm machine.
type machineFacts struct {
	// Bin is the QEMU binary.
	Bin string
	// Extra are data directories isopod passes with -L: the binary's own
	// ../share/qemu and ../share/seabios where QEMU would not look there
	// (a build unpacked away from the prefix it was configured for).
	Extra []string
	// SearchPath is where QEMU looks for firmware, in order (-L help,
	// with Extra first).
	SearchPath []string
	// Microvm are the microvm machine's properties (-machine
	// microvm,help); nil when the binary has no microvm machine.
	Microvm map[string]bool
	// Backend are memory-backend-file's properties.
	Backend map[string]bool
	// Firmware is where microvmFirmware was found, symlinks resolved
	// ("": nowhere on SearchPath), and Kind what it is.
	Firmware string
	Kind     firmwareKind
}

// machinePlan is how isopod starts the microvm machine of one QEMU.
type machinePlan struct {
	// Options is the -machine value.
	Options string
	// DataDirs are passed with -L, in order.
	DataDirs []string
	// SearchPath is where this QEMU reads firmware from; a jailed QEMU
	// is given every one of them that exists.
	SearchPath []string
	// OptionROMs: option ROMs stay on (the firmware needs them to load
	// the kernel).
	OptionROMs bool
	Firmware   string
	Kind       firmwareKind
	// DirectKernel: the firmware boots an uncompressed kernel (vmlinux,
	// by its PVH entry) with every device isopod attaches. qboot does;
	// SeaBIOS's PVH option ROM leaves a guest with more than about eight
	// virtio-mmio devices (a snapshot VM's every disk slot) hanging at
	// its interrupt setup, so under it the bzImage boots.
	DirectKernel bool
	// ROMOff: memory-backend-file has rom=, so a file opened read-only
	// can be mapped as writable private RAM (QEMU 8.2 and later).
	ROMOff bool
	// Why says, in sentences, which firmware and options and why.
	Why string
}

// microvmNeeds are the microvm properties isopod sets, each needed: ACPI
// on (the kernel finds the virtio-mmio devices through ACPI: it is built
// without command-line virtio-mmio devices); PIT and PIC off (the guest
// uses the local APIC and IOAPIC, and under TCG the TSC frequency is given
// on the command line, so no PIT calibration is needed); RTC on (without
// it the kernel spends about two seconds probing for a clock); the ISA
// serial port (the console); no virtio-mmio devices on the kernel command
// line.
var microvmNeeds = []string{"acpi=on", "pit=off", "pic=off", "rtc=on", "isa-serial=on", "auto-kernel-cmdline=off"}

// planMachine chooses the machine options from f. Option ROMs are turned
// off only under qboot, which loads the kernel itself (a little less to
// set up); any other firmware keeps them, as SeaBIOS needs them.
func planMachine(f machineFacts) (machinePlan, error) {
	if f.Microvm == nil {
		return machinePlan{}, fmt.Errorf("qemu: %s has no microvm machine; install QEMU 7.2 or newer built with it (Debian, Ubuntu: qemu-system-x86): %w",
			f.Bin, errdefs.ErrFailedPrecondition)
	}
	var missing []string
	for _, o := range microvmNeeds {
		if k, _, _ := strings.Cut(o, "="); !f.Microvm[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return machinePlan{}, fmt.Errorf("qemu: %s's microvm machine lacks the options %s; install QEMU 7.2 or newer: %w",
			f.Bin, strings.Join(missing, ", "), errdefs.ErrFailedPrecondition)
	}
	if f.Firmware == "" {
		return machinePlan{}, fmt.Errorf("qemu: %s finds no %s, the microvm firmware, in %s; install its firmware (Debian, Ubuntu: qemu-system-data and seabios, or qemu-system-x86's own): %w",
			f.Bin, microvmFirmware, strings.Join(f.SearchPath, ", "), errdefs.ErrFailedPrecondition)
	}
	p := machinePlan{
		DataDirs: f.Extra, SearchPath: f.SearchPath,
		Firmware: f.Firmware, Kind: f.Kind, ROMOff: f.Backend["rom"],
		DirectKernel: f.Kind == firmwareQboot,
		OptionROMs:   f.Kind != firmwareQboot || !f.Microvm["x-option-roms"],
	}
	opts := []string{"microvm", microvmNeeds[0]}
	if !p.OptionROMs {
		opts = append(opts, "x-option-roms=off")
	}
	p.Options = strings.Join(append(opts, microvmNeeds[1:]...), ",")
	switch {
	case f.Kind == firmwareQboot && !p.OptionROMs:
		p.Why = fmt.Sprintf("The microvm firmware is qboot (%s), which loads the kernel itself, so option ROMs are off.", f.Firmware)
	case f.Kind == firmwareQboot:
		p.Why = fmt.Sprintf("The microvm firmware is qboot (%s); this QEMU cannot turn option ROMs off, and qboot boots with them.", f.Firmware)
	case f.Kind == firmwareSeaBIOS:
		p.Why = fmt.Sprintf("The microvm firmware is SeaBIOS (%s), which loads the kernel through an option ROM, so option ROMs stay on.", f.Firmware)
	default:
		p.Why = fmt.Sprintf("The microvm firmware %s is neither qboot nor SeaBIOS as far as isopod can tell, so option ROMs stay on (either firmware boots with them).", f.Firmware)
	}
	if !p.DirectKernel {
		p.Why += " Under it the guest kernel boots from its bzImage, not the uncompressed vmlinux: a direct boot hangs with many virtio devices."
	}
	if len(f.Extra) > 0 {
		p.Why += fmt.Sprintf(" QEMU's data directories are not where it was built to look for them, so they are passed with -L: %s.", strings.Join(f.Extra, ", "))
	}
	return p, nil
}

// helpTexts are what bin says of its data directories (-L help), its
// microvm machine and its file memory backend.
type helpTexts struct{ L, Microvm, Backend string }

// askHelp runs bin three times, at once, for its help texts.
func askHelp(ctx context.Context, bin string) (helpTexts, error) {
	var h helpTexts
	g, gctx := errgroup.WithContext(ctx)
	help := func(out *string, args ...string) func() error {
		return func() error {
			b, err := exec.CommandContext(gctx, bin, args...).Output()
			if err != nil {
				return fmt.Errorf("qemu: running %s %s: %w", bin, strings.Join(args, " "), err)
			}
			*out = string(b)
			return nil
		}
	}
	g.Go(help(&h.L, "-L", "help"))
	g.Go(help(&h.Microvm, "-machine", "microvm,help"))
	g.Go(help(&h.Backend, "-object", "memory-backend-file,help"))
	return h, g.Wait()
}

// probeMachine asks bin about its microvm machine (through cache, which
// keeps the answers across processes) and finds its firmware.
func probeMachine(ctx context.Context, cache factsCache, bin string) (machineFacts, error) {
	h, err := cache.cachedHelp(ctx, bin)
	if err != nil {
		return machineFacts{}, err
	}
	f := machineFacts{Bin: bin}
	f.Extra, f.SearchPath = searchPath(bin, lines(h.L))
	if strings.Contains(h.Microvm, "microvm-machine options") || strings.Contains(h.Microvm, "=<") {
		f.Microvm = helpProps(h.Microvm)
	}
	f.Backend = helpProps(h.Backend)
	f.Firmware, f.Kind = findFirmware(f.SearchPath, microvmFirmware)
	return f, nil
}

// searchPath returns the data directories to add (the binary's own
// ../share/qemu and ../share/seabios, when they exist and QEMU does not
// look there) and the whole search path, those first, as QEMU orders -L
// directories before its own.
func searchPath(bin string, defaults []string) (extra, all []string) {
	known := map[string]bool{}
	for _, d := range defaults {
		known[realDir(d)] = true
	}
	base := filepath.Dir(bin)
	for _, rel := range []string{"../share/qemu", "../share/seabios"} {
		d := filepath.Join(base, rel)
		if st, err := os.Stat(d); err != nil || !st.IsDir() || known[realDir(d)] {
			continue
		}
		extra = append(extra, d)
	}
	return extra, append(slices.Clone(extra), defaults...)
}

// realDir is d cleaned, with symlinks resolved where it exists.
func realDir(d string) string {
	if r, err := filepath.EvalSymlinks(d); err == nil {
		return r
	}
	return filepath.Clean(d)
}

// findFirmware finds name on path, as QEMU does (the first directory that
// has it), resolves symlinks and tells which firmware it is.
func findFirmware(path []string, name string) (string, firmwareKind) {
	for _, d := range path {
		p := filepath.Join(d, name)
		if _, err := os.Stat(p); err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		return p, firmwareOf(p)
	}
	return "", ""
}

// firmwareOf tells qboot from SeaBIOS by the name each puts in its image.
func firmwareOf(path string) firmwareKind {
	f, err := os.Open(path)
	if err != nil {
		return firmwareUnknown
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 16<<20))
	switch {
	case err != nil:
		return firmwareUnknown
	case bytes.Contains(b, []byte("SeaBIOS")):
		return firmwareSeaBIOS
	case bytes.Contains(b, []byte("qboot")):
		return firmwareQboot
	}
	return firmwareUnknown
}

// helpProps reads the property names of `-machine X,help` or `-object
// X,help` output ("  name=<type>  - description").
func helpProps(out string) map[string]bool {
	props := map[string]bool{}
	for _, l := range lines(out) {
		name, typ, ok := strings.Cut(l, "=")
		if ok && strings.HasPrefix(typ, "<") && !strings.ContainsAny(name, " \t") {
			props[name] = true
		}
	}
	return props
}

// lines returns the non-empty lines of s, trimmed.
func lines(s string) []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// machine returns the Driver's machine plan, probing the binary the first
// time. A failed probe is retried by the next call.
func (d *Driver) machine(ctx context.Context) (*machinePlan, error) {
	d.machineMu.Lock()
	defer d.machineMu.Unlock()
	if d.plan != nil {
		return d.plan, nil
	}
	f, err := d.machineProbe(ctx, d.bin)
	if err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("qemu: %w: %w", errdefs.ErrUnavailable, errors.Join(err, ctx.Err()))
		}
		return nil, err
	}
	p, err := planMachine(f)
	if err != nil {
		return nil, err
	}
	d.log.Info("qemu machine", "options", p.Options, "firmware", p.Firmware, "data_dirs", p.DataDirs, "why", p.Why)
	d.plan = &p
	return d.plan, nil
}

// kernelFor is the kernel image cfg boots with: its bzImage where this
// QEMU's firmware cannot boot the uncompressed kernel directly (see
// machinePlan.DirectKernel), else cfg.Kernel.
func (d *Driver) kernelFor(cfg *vmm.Config) string {
	d.machineMu.Lock()
	plan := d.plan
	d.machineMu.Unlock()
	if plan != nil && !plan.DirectKernel && cfg.BzImage != "" {
		return cfg.BzImage
	}
	return cfg.Kernel
}
