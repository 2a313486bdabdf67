package machine

import (
	"io"
	"log/slog"

	"isopod/internal/egress"
	"isopod/internal/vmm"
)

// Spec is one VM as its caller planned it: what the VMM is given, the
// disks behind its slots, its network, the guest's own settings, and the
// warm-pool snapshot it may resume from. A Spec outlives any one command:
// a Machine made from it runs as many as its caller sends.
type Spec struct {
	ID, Dir        string // the VM's id and directory (logs, flow log)
	Kernel, Initrd string
	BzImage        string // see vmm.Config
	VCPUs, MemMiB  int
	Disks          Disks
	// Network is the parsed policy of the VM's network (the zero Rules:
	// NAT); nil: no NIC.
	Network *egress.Rules
	// Hostname is the guest's name; Env the environment every command
	// starts from, before its own.
	Hostname string
	Env      []string
	// SnapshotKey is the warm-pool key of the snapshot the VM resumes
	// from ("": it boots cold).
	SnapshotKey string
	SerialLog   io.Writer
	Logger      *slog.Logger
}

// ColdConfig is the VMM configuration of a cold boot: the kernel, the
// command line naming the hostname, only the disks in use, and net (the
// Machine's NIC; nil: none).
func (s Spec) ColdConfig(net *vmm.Net) vmm.Config {
	return vmm.Config{
		ID:        s.ID,
		Dir:       s.Dir,
		Kernel:    s.Kernel,
		BzImage:   s.BzImage,
		Initrd:    s.Initrd,
		Cmdline:   Cmdline(s.Hostname),
		VCPUs:     s.VCPUs,
		MemMiB:    s.MemMiB,
		Disks:     s.Disks.Cold(),
		Net:       net,
		SerialLog: s.SerialLog,
		Logger:    s.Logger,
	}
}

// ExecEnv is a command's whole environment: Env, then its own.
func (s Spec) ExecEnv(own []string) []string {
	return append(append([]string(nil), s.Env...), own...)
}
