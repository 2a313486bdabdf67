package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"isopod/internal/image"
	"isopod/internal/jail"
	"isopod/internal/vmm"
)

// tcgCost says what running without KVM costs, as measured on a 2-vCPU
// host under TCG (BENCHMARKS.md, "Guest code under TCG against the host"):
// boots of seconds, and guest code far slower than the same binary on the
// host.
const tcgCost = "every VM runs under TCG, QEMU's software emulation: a cold boot takes 3-5 s on an idle 2-vCPU host (more under load), " +
	"and guest code runs roughly 10-100x slower than on the host (measured with the same busybox: a shell loop 10-27x, " +
	"sha256sum of 256 MiB 60-90x); KVM runs it at close to host speed"

// findQEMU finds the QEMU a run would start: ISOPOD_QEMU, else
// DefaultQEMU on PATH. It returns where it looked, for messages.
func findQEMU(cfg Config, h Host) (path, from string, err error) {
	bin, from := cfg.QEMU, "ISOPOD_QEMU="+cfg.QEMU
	if bin == "" {
		bin, from = DefaultQEMU, DefaultQEMU+" on PATH"
	}
	if h.LookPath == nil {
		return "", from, errors.New("cannot look for programs on this host")
	}
	path, err = h.LookPath(bin)
	return path, from, err
}

func checkQEMU(ctx context.Context, cfg Config, h Host) Check {
	c := Check{Name: "qemu", Required: true}
	install := fmt.Sprintf("install QEMU %d.%d or newer (Debian, Ubuntu: `apt-get install qemu-system-x86`; Fedora: `dnf install qemu-system-x86-core`), or set ISOPOD_QEMU to a qemu-system-x86_64",
		MinQEMU[0], MinQEMU[1])
	path, from, err := findQEMU(cfg, h)
	if err != nil {
		c.Why, c.Fix = fmt.Sprintf("QEMU not found (%s): %v", from, err), install
		return c
	}
	if h.QEMUVersion == nil {
		c.Why, c.Fix = "cannot run QEMU on this host", install
		return c
	}
	c.Detail = map[string]any{"path": path}
	out, err := h.QEMUVersion(ctx, path)
	if err != nil {
		c.Why, c.Fix = fmt.Sprintf("%s -version failed: %v", path, err), install
		return c
	}
	v, major, minor, ok := qemuVersion(out)
	if !ok {
		c.Why, c.Fix = fmt.Sprintf("%s -version printed no version: %q", path, firstLine(out)), install
		return c
	}
	c.Detail["version"] = v
	if major < MinQEMU[0] || major == MinQEMU[0] && minor < MinQEMU[1] {
		c.Why = fmt.Sprintf("QEMU %s at %s is older than %d.%d, the oldest isopod is tested with", v, path, MinQEMU[0], MinQEMU[1])
		c.Fix = install
		return c
	}
	c.OK, c.Why = true, fmt.Sprintf("QEMU %s at %s", v, path)
	p, err := prober(ctx, h)
	if p == nil && err == nil {
		return c
	}
	var m vmm.MachineInfo
	if err == nil {
		m, err = p.Machine(ctx)
	}
	if err != nil {
		c.OK = false
		c.Why = fmt.Sprintf("QEMU %s at %s cannot start isopod's machine: %v", v, path, err)
		c.Fix = "install the QEMU's firmware (Debian, Ubuntu: qemu-system-data and seabios), or " + install
		return c
	}
	c.Why += fmt.Sprintf(", started with -machine %s. %s", m.Options, m.Why)
	c.Detail["machine_options"] = m.Options
	c.Detail["firmware"] = m.Firmware
	c.Detail["firmware_kind"] = m.FirmwareKind
	if len(m.DataDirs) > 0 {
		c.Detail["data_dirs"] = m.DataDirs
	}
	return c
}

var qemuVersionRE = regexp.MustCompile(`version ([0-9]+)\.([0-9]+)(\.[0-9]+)?`)

// qemuVersion reads "QEMU emulator version 7.2.19 (Debian ...)".
func qemuVersion(out string) (v string, major, minor int, ok bool) {
	m := qemuVersionRE.FindStringSubmatch(out)
	if m == nil {
		return "", 0, 0, false
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return m[1] + "." + m[2] + m[3], major, minor, true
}

// prober is the core's VMM driver as Host.VMM gives it; nil and no
// error when the host has none.
func prober(ctx context.Context, h Host) (vmm.Prober, error) {
	if h.VMM == nil {
		return nil, nil
	}
	return h.VMM(ctx)
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return l
}

// checkKVM says whether runs get KVM. Not required: without it they run
// under TCG, much slower.
func checkKVM(ctx context.Context, cfg Config, h Host) Check {
	c := Check{Name: "kvm"}
	if cfg.Accel == "tcg" {
		c.Why = "ISOPOD_ACCEL=tcg forces TCG: " + tcgCost
		c.Fix = "unset ISOPOD_ACCEL to use KVM where /dev/kvm works"
		return c
	}
	// A driver that cannot be had says nothing of KVM: the qemu check
	// says why.
	var verdict vmm.AccelVerdict
	if p, err := prober(ctx, h); err == nil && p != nil {
		verdict = p.AccelVerdict(ctx)
	}
	if why := verdict.Obstacle; why != "" {
		c.Why = fmt.Sprintf("KVM cannot be used. %s So %s", why, tcgCost)
		c.Fix = verdict.Fix
		c.Detail = map[string]any{"kvm_reason": why}
		if cfg.Accel == "kvm" {
			c.Why = "ISOPOD_ACCEL=kvm forces KVM, but KVM cannot be used, so runs fail. " + why
		}
		return c
	}
	var err error = errors.New("cannot be checked")
	if h.OpenKVM != nil {
		err = h.OpenKVM()
	}
	if err != nil {
		c.Why = fmt.Sprintf("/dev/kvm is not usable (%v), so %s", err, tcgCost)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			c.Fix = "enable hardware virtualization (VT-x or AMD-V in the firmware; nested virtualization for a VM) and load kvm_intel or kvm_amd"
		case errors.Is(err, fs.ErrPermission):
			c.Fix = "add yourself to the kvm group (`sudo usermod -aG kvm $USER`, then log in again)"
		default:
			c.Fix = "make /dev/kvm readable and writable by the user that runs isopod"
		}
		if cfg.Accel == "kvm" {
			c.Why = "ISOPOD_ACCEL=kvm forces KVM, but /dev/kvm is not usable: runs fail"
		}
		return c
	}
	probe := verdict.Probe
	if probe != nil && !probe.OK && cfg.Accel != "kvm" {
		c.Why = fmt.Sprintf("/dev/kvm opens, but QEMU could not run a guest with it (last probe, %s). %s So %s",
			probe.At.UTC().Format("2006-01-02 15:04 MST"), firstLine(probe.Reason), tcgCost)
		c.Fix = "use a host whose KVM runs guests (on a VM, one with working nested virtualization); the probe is retried hourly"
		c.Detail = map[string]any{"probe_reason": probe.Reason}
		return c
	}
	c.OK, c.Why = true, "/dev/kvm is usable: VMs run under KVM"
	if probe == nil && cfg.Accel != "kvm" {
		c.Why = "/dev/kvm is usable; the first run probes whether QEMU can run a guest with it, and falls back to TCG if not"
	}
	return c
}

// checkJail sets the jail up as a run would and starts QEMU in it.
// Required, unless ISOPOD_JAIL=off (then runs warn that they are
// unconfined).
func checkJail(ctx context.Context, cfg Config, h Host) Check {
	c := Check{Name: "jail", Required: true}
	if cfg.JailOff {
		c.OK = true
		c.Why = "ISOPOD_JAIL=off: VMMs run unconfined, and every run's report warns of it"
		c.Fix = "unset ISOPOD_JAIL to confine every VMM"
		return c
	}
	if h.Jail == nil {
		c.Why = "cannot check the jail on this host"
		return c
	}
	qemu, _, _ := findQEMU(cfg, h)
	info, err := h.Jail(ctx, qemu)
	if err != nil {
		c.Why = err.Error()
		c.Fix = "see why, or set ISOPOD_JAIL=off to run VMMs unconfined (for debugging only)"
		if se, ok := errors.AsType[*jail.SetupError](err); ok {
			c.Why, c.Fix = "the VMM jail cannot be set up: "+se.What, se.Fix
		}
		return c
	}
	c.OK = true
	c.Why = fmt.Sprintf("user namespaces, cgroups or their fallback, and the VMM's uid %d are available", info.UID)
	if info.Tried {
		c.Why += "; QEMU starts in the jail"
	} else {
		c.Why += "; QEMU was not tried in it (not found)"
	}
	c.Detail = map[string]any{"uid": info.UID, "gid": info.GID, "qemu_tried": info.Tried, "helper": info.Helper}
	if len(info.Warnings) > 0 {
		c.Why += ", with a weaker fallback: " + strings.Join(info.Warnings, "; ")
		c.Detail["warnings"] = info.Warnings
	}
	switch {
	case info.Helper != "":
		c.Why += "; the jail helper " + info.Helper + " starts each VMM"
	case len(info.PassedOver) > 0:
		c.Why += "; isopod re-executes itself to start each VMM, as the jail helper was passed over (" +
			strings.Join(info.PassedOver, "; ") + "): make it a regular file owned by root or by you, executable and not writable by group or others"
		c.Detail["helpers_passed_over"] = info.PassedOver
	default:
		c.Why += "; isopod re-executes itself to start each VMM, as isopod-jail is not installed beside it: " +
			"installing isopod-jail there (scripts/install.sh and the packages do) makes each VMM start faster"
	}
	return c
}

// checkImages checks the kernel, the guest agent, the initramfs and each
// base; one current base is required.
func checkImages(cfg Config, h Host) []Check {
	kernel, agent := checkKernel(h), checkAgent(h)
	initramfs := Check{Name: "initramfs", Required: true, Why: "cannot list the images"}
	base := Check{Name: "base", Required: true, Why: "cannot list the images"}
	var bases []Check
	var images []image.ImageInfo
	var err error
	if h.Images != nil {
		images, err = h.Images()
		if err != nil {
			initramfs.Why, base.Why = "listing the images: "+err.Error(), "listing the images: "+err.Error()
		}
	}
	build := "isopod image build"
	if cfg.Kernel != "" {
		build = "isopod --kernel " + cfg.Kernel + " image build"
	}
	var usable, known []string
	for _, ii := range images {
		c := Check{Name: ii.Flavor, Detail: map[string]any{"built": ii.Built, "path": ii.Path}}
		switch {
		case !ii.Built:
			c.Why, c.Fix = ii.Flavor+" is not built", build+" "+ii.Flavor
		case ii.Stale:
			c.Why, c.Fix = fmt.Sprintf("%s is stale: %s", ii.Flavor, ii.StaleReason), build+" "+ii.Flavor
			c.Detail["stale_reason"] = ii.StaleReason
		default:
			c.OK, c.Why = true, fmt.Sprintf("%s is built and current (%s)", ii.Flavor, ii.Path)
		}
		if ii.Built {
			c.Detail["content_sha256"] = ii.ContentSHA256
		}
		if ii.Flavor == image.FlavorInitramfs {
			c.Required = true
			if !kernel.OK && !c.OK {
				c.Fix = "isopod image fetch-kernel, then " + c.Fix
			}
			initramfs = c
			continue
		}
		known = append(known, ii.Flavor)
		if c.OK {
			usable = append(usable, ii.Flavor)
		}
		bases = append(bases, c)
	}
	if images != nil {
		if len(usable) > 0 {
			base.OK, base.Why = true, "runs can use "+strings.Join(usable, ", ")
		} else {
			base.Why = "no base image is built and current, so every run is refused (known: " + strings.Join(known, ", ") + "); `" +
				build + " " + image.FlavorBaseMin + "` (busybox, about a minute) fetches the kernel and builds the initramfs first when they are missing, " +
				"and `" + build + "-all` builds every base (base-debian needs debootstrap and several minutes)"
			base.Fix = build + " " + image.FlavorBaseMin
		}
	}
	sort.SliceStable(bases, func(i, j int) bool { return bases[i].Name < bases[j].Name })
	out := []Check{kernel, agent, initramfs, base}
	return append(out, bases...)
}

// checkKernel finds the guest kernel and says whether it is the pinned one.
func checkKernel(h Host) Check {
	kernel := Check{Name: "kernel", Required: true}
	if h.Kernel == nil {
		kernel.Why = "cannot look for the guest kernel"
	} else if bk, err := h.Kernel(); err != nil {
		kernel.Why, kernel.Fix = err.Error(), "isopod image fetch-kernel"
	} else {
		kernel.OK = true
		kernel.Detail = map[string]any{"path": bk.Path}
		switch {
		case bk.BuiltIn:
			kernel.Why = "a custom kernel with every driver built in: " + bk.Path
		case bk.Info.Pinned:
			kernel.Why = fmt.Sprintf("the pinned guest kernel %s %s", bk.Info.Package, bk.Info.Version)
		default:
			kernel.Why = fmt.Sprintf("the guest kernel %s %s, which is not the pinned one (runs may fail to boot)", bk.Info.Package, bk.Info.Version)
			kernel.Fix = "isopod image fetch-kernel, then isopod image build-all"
		}
		if !bk.BuiltIn {
			kernel.Detail["version"] = bk.Info.Version
		}
	}
	return kernel
}

// checkAgent finds the guest agent the initramfs is built from.
func checkAgent(h Host) Check {
	agent := Check{Name: "agent"}
	if h.Agent == nil {
		agent.Why = "cannot look for the guest agent"
	} else if p, err := h.Agent(); err != nil {
		agent.Why = err.Error() + "; without it the initramfs cannot be built"
		agent.Fix = "reinstall the isopod package (it puts the agent in " + image.SystemAgentPath + "), or set ISOPOD_AGENT_BIN"
	} else {
		agent.OK, agent.Why = true, "the guest agent "+p
		agent.Detail = map[string]any{"path": p}
	}
	return agent
}

// checkDisk requires cfg.MinFreeBytes free on the filesystem of the state
// root.
func checkDisk(cfg Config, h Host) Check {
	c := Check{Name: "disk", Required: true}
	if h.FreeBytes == nil {
		c.Why = "cannot measure free space"
		return c
	}
	free, at, err := h.FreeBytes(cfg.Home)
	if err != nil {
		c.Why = fmt.Sprintf("cannot measure free space under %s: %v", cfg.Home, err)
		c.Fix = "make " + cfg.Home + " (ISOPOD_HOME) a directory isopod can use"
		return c
	}
	c.Detail = map[string]any{"free_bytes": free, "path": at, "min_free_bytes": cfg.MinFreeBytes}
	c.Why = fmt.Sprintf("%s free on the filesystem of %s", gib(free), at)
	if free < cfg.MinFreeBytes {
		c.Why += fmt.Sprintf(", under the %s that building base-debian and a few runs need", gib(cfg.MinFreeBytes))
		c.Fix = "free space there (`isopod vm gc` prunes old VM records, `isopod stage rm` unused stages), or set ISOPOD_HOME to a larger filesystem"
		return c
	}
	c.OK = true
	return c
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

// checkWarmPool reports the snapshots and the stale ones; never required.
func checkWarmPool(ctx context.Context, h Host) Check {
	c := Check{Name: "warm_pool"}
	if h.WarmPool == nil {
		c.OK, c.Why = true, "not checked"
		return c
	}
	wp, err := h.WarmPool(ctx)
	if err != nil {
		c.Why = "listing the warm pool: " + err.Error()
		return c
	}
	c.Detail = map[string]any{"snapshots": wp.Snapshots, "allocated_bytes": wp.Bytes, "stale": len(wp.Stale)}
	switch {
	case wp.Snapshots == 0:
		c.OK, c.Why = true, "empty: the first eligible run (networked, on a fresh base, no commit) builds a snapshot, later ones resume from it"
	case len(wp.Stale) == 0:
		c.OK, c.Why = true, fmt.Sprintf("%d snapshot(s), %s, all current", wp.Snapshots, gib(uint64(wp.Bytes)))
	default:
		keys := make([]string, 0, len(wp.Stale))
		for k := range wp.Stale {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var why []string
		for _, k := range keys {
			why = append(why, k+": "+wp.Stale[k])
		}
		c.Why = fmt.Sprintf("%d snapshot(s), %s; %d no run would use now (%s)", wp.Snapshots, gib(uint64(wp.Bytes)), len(wp.Stale), strings.Join(why, "; "))
		c.Fix = "isopod vm gc (removes the ones no run can use again), or isopod warmpool rm --all"
	}
	return c
}
