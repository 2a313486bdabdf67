package qemu

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// Inherited descriptors: QEMU sees the ExtraFiles of its exec.Cmd from fd 3.
const (
	fdAgent = 3 // connected unix stream socket: the agent virtserialport
	fdQMP   = 4 // connected unix stream socket: the QMP monitor
)

// AgentPortName is the virtio-serial port name the guest agent looks for.
const AgentPortName = agentproto.PortName

// launch is what buildArgs needs beyond the vmm.Config.
type launch struct {
	// machine is the -machine value and dataDirs the -L directories (see
	// machinePlan).
	machine  string
	dataDirs []string
	accel    vmm.Accel
	tscKHz   uint64 // host TSC kHz, used under TCG; 0: unknown
	// memPath is the file guest RAM is mapped from: the host's memfd,
	// shared, so that Snapshot can copy it; or for a restore (restored
	// set), a snapshot's RAM, mapped privately so that many machines
	// share it copy-on-write.
	memPath  string
	restored bool
	// ownRAM (a restore, vmm.Config.OwnRAM): memPath is the host's memfd
	// holding a copy of the snapshot's RAM, shared like a boot's.
	ownRAM bool
	// romOff (a restore) maps memPath, opened read-only, as writable
	// private RAM: readonly=on,rom=off (QEMU 8.2 and later).
	romOff bool
	// ramFrom says where guest RAM came from (for the log): a new memfd,
	// the snapshot's file, the file opened read-only, or a sealed copy.
	ramFrom string
	// snapshotRAM (input) is a restore's RAM file.
	snapshotRAM string
	incoming    string // when set, -incoming value (restore)
	// Inherited descriptors (see files.go): the kernel and initramfs as
	// paths QEMU opens, each disk's fd, the NIC's connected socket (0:
	// none).
	kernelPath string
	initrdPath string
	diskFDs    [][]int // one fd set per disk
	netFD      int
	// sandbox adds QEMU's own seccomp filter (jailed machines).
	sandbox bool
}

// sandboxOptions turn on QEMU's seccomp filter: obsolete system calls,
// privilege changes, process creation and resource control are refused.
const sandboxOptions = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"

// escapeOpt doubles commas so a value can sit inside a QEMU option list.
func escapeOpt(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// onOff renders a bool as QEMU's on/off.
func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// kernelCmdline adds what the machine itself needs to the caller's command
// line: the serial console, and under TCG the TSC frequency so that the guest
// does not calibrate it against timers that run unevenly under emulation.
func kernelCmdline(user string, accel vmm.Accel, tscKHz uint64) string {
	var parts []string
	if !hasParam(user, "console") {
		parts = append(parts, "console=ttyS0")
	}
	if accel == vmm.AccelTCG && tscKHz > 0 {
		if !hasParam(user, "tsc_early_khz") {
			parts = append(parts, "tsc_early_khz="+strconv.FormatUint(tscKHz, 10))
		}
		if !hasParam(user, "tsc") {
			parts = append(parts, "tsc=reliable")
		}
	}
	if s := strings.TrimSpace(user); s != "" {
		parts = append(parts, s)
	}
	return strings.Join(parts, " ")
}

// hasParam reports whether cmdline has key=... or a bare key before any "--".
func hasParam(cmdline, key string) bool {
	for _, f := range strings.Fields(cmdline) {
		if f == "--" {
			return false
		}
		k, _, _ := strings.Cut(f, "=")
		if k == key {
			return true
		}
	}
	return false
}

// checkConfig refuses what QEMU cannot express, beyond vmm.Config.Validate.
func checkConfig(cfg *vmm.Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if strings.ContainsAny(cfg.ID, " \t\n,=") {
		return fmt.Errorf("qemu: id %q must not contain spaces, commas or '=': %w", cfg.ID, errdefs.ErrInvalidArgument)
	}
	for _, d := range cfg.Disks {
		if strings.ContainsAny(d.Serial, " \t\n,=\"") {
			return fmt.Errorf("qemu: disk serial %q must be plain characters: %w", d.Serial, errdefs.ErrInvalidArgument)
		}
	}
	if cfg.Net != nil {
		if cfg.Net.Socket == "" {
			return fmt.Errorf("qemu: NIC needs a unix socket (tap %q is for firecracker): %w", cfg.Net.Tap, errdefs.ErrNotSupported)
		}
		if _, err := net.ParseMAC(cfg.Net.MAC); err != nil || len(cfg.Net.MAC) != 17 {
			return fmt.Errorf("qemu: NIC MAC %q must look like 52:54:00:12:34:56: %w", cfg.Net.MAC, errdefs.ErrInvalidArgument)
		}
	}
	return nil
}

// tcgCPU is the emulated CPU: everything TCG offers but the fast string
// moves (ERMS, FSRM). With them the guest copies memory with `rep movsb`,
// which TCG emulates a byte at a time; without them it uses word-sized
// loops, which it translates: unpacking the initramfs and loading modules,
// and every copy in the guest after, run faster (BENCHMARKS.md).
const tcgCPU = "max,erms=off,fsrm=off"

// buildArgs returns QEMU's argv (without the binary) for cfg. It is pure:
// everything it needs is in its arguments.
func buildArgs(cfg *vmm.Config, l launch) []string {
	a := []string{
		"-name", "isopod-" + cfg.ID,
		"-nodefaults", "-no-user-config", "-nographic", "-no-reboot",
	}
	for _, d := range l.dataDirs {
		a = append(a, "-L", d)
	}
	a = append(a, "-machine", l.machine, "-accel", string(l.accel))
	if l.accel == vmm.AccelKVM {
		a = append(a, "-cpu", "host")
	} else {
		a = append(a, "-cpu", tcgCPU)
	}
	a = append(a, "-smp", strconv.Itoa(cfg.VCPUs))
	mem := fmt.Sprintf("memory-backend-file,id=mem0,size=%dM,mem-path=%s,share=%s",
		cfg.MemMiB, escapeOpt(l.memPath), onOff(!l.restored || l.ownRAM))
	if l.restored && !l.ownRAM && l.romOff {
		mem += ",readonly=on,rom=off"
	}
	a = append(a,
		"-m", strconv.Itoa(cfg.MemMiB)+"M",
		"-object", mem,
		"-machine", "memory-backend=mem0")
	a = append(a,
		"-kernel", l.kernelPath,
		"-append", kernelCmdline(cfg.Cmdline, l.accel, l.tscKHz))
	if l.initrdPath != "" {
		a = append(a, "-initrd", l.initrdPath)
	}
	if l.sandbox {
		a = append(a, "-sandbox", sandboxOptions)
	}
	a = append(a,
		// The console: QEMU's stdout, copied into cfg.SerialLog.
		"-chardev", "stdio,id=con0,signal=off",
		"-serial", "chardev:con0",
		// QMP on an inherited, already connected socket.
		"-chardev", "socket,id=qmp0,fd="+strconv.Itoa(fdQMP),
		"-mon", "chardev=qmp0,mode=control",
		// Modern virtio-mmio.
		"-global", "virtio-mmio.force-legacy=false",
		// The agent channel.
		"-device", "virtio-serial-device,id=vser0,max_ports=2",
		"-chardev", "socket,id=agent0,fd="+strconv.Itoa(fdAgent),
		"-device", "virtserialport,chardev=agent0,name="+AgentPortName,
		// A generation ID that is new in every QEMU process, so a kernel
		// with the vmgenid driver reseeds its CRNG in each clone of a
		// snapshot. (The pinned kernel has no driver; the agent reseeds.)
		"-device", "vmgenid,id=vmgenid0,guid=auto",
	)
	a = append(a, diskArgs(cfg.Disks, l.diskFDs)...)
	if cfg.Net != nil {
		// No guest announce: after a restore the guest would otherwise
		// send gratuitous ARPs and neighbour advertisements to a network
		// stack that is new and has nothing to relearn.
		a = append(a,
			"-netdev", "stream,id=net0,server=off,addr.type=fd,addr.str="+strconv.Itoa(l.netFD),
			"-device", "virtio-net-device,netdev=net0,guest_announce=off,mac="+cfg.Net.MAC)
	}
	if l.incoming != "" {
		a = append(a, "-incoming", l.incoming)
	}
	return a
}

// diskArgs attaches disks, each from its fd set (fds[i] for disks[i]), as
// virtio-blk devices carrying their serials.
func diskArgs(disks []vmm.Disk, fds [][]int) []string {
	var a []string
	for i, d := range disks {
		id := "disk" + strconv.Itoa(i)
		set := strconv.Itoa(i + 1)
		for _, fd := range fds[i] {
			a = append(a, "-add-fd", "fd="+strconv.Itoa(fd)+",set="+set)
		}
		drive := "if=none,id=" + id + ",file=/dev/fdset/" + set +
			",format=raw,readonly=" + onOff(d.ReadOnly) +
			// Guest writes reach the host file (page cache) when the guest
			// sees them complete; guest flushes are not turned into host
			// fsyncs. The host keeps the data when QEMU is killed; whoever
			// needs it on stable storage fsyncs the file.
			",cache=unsafe,aio=threads"
		// A writable disk's set holds two open file descriptions (read-only
		// and read-write), and QEMU's image locks are per description: a
		// restored QEMU 10, which takes its disks up inactive and reopens
		// them read-write at resume, would find its own read-only
		// description's lock in the way ("Failed to get shared "write"
		// lock"). Each machine's writable disk is its own (isopod makes
		// it), so QEMU's locks guard nothing there.
		if !d.ReadOnly {
			drive += ",discard=unmap,file.locking=off"
		}
		a = append(a,
			"-drive", drive,
			"-device", "virtio-blk-device,drive="+id+",serial="+d.Serial)
	}
	return a
}
