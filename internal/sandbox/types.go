package sandbox

import (
	"context"
	"io"
	"os"

	"isopod/internal/admission"
	"isopod/internal/credential"
	"isopod/internal/egress"
	"isopod/internal/machine"
	"isopod/internal/workspace"
)

// Defaults and limits of a run.
const (
	DefaultVCPUs      = 1
	MaxVCPUs          = 32
	DefaultMemMiB     = 512
	MinMemMiB         = 128
	MaxMemMiB         = 4096
	DefaultScratchMiB = 1024
	MinScratchMiB     = 128
	MaxScratchMiB     = int(machine.SlotBytes >> 20) // a snapshot slot fits any scratch disk
	DefaultTimeoutS   = 120
	MaxTimeoutS       = 3600
	DefaultBase       = "base-min"
	BaseStage         = "base" // the reserved empty stage

	// InlineCap is how much of each output stream a report carries.
	InlineCap = machine.InlineCap
	// LogCap is how much of each output stream is kept on disk.
	LogCap = machine.LogCap
	// SerialLogCap is how much of the guest console is kept on disk.
	SerialLogCap = machine.SerialLogCap
	// MaxCopyOutBytes caps the size of one copied file.
	MaxCopyOutBytes = 16 << 30
	// DefaultCopyOutMaxData caps the data all copy-outs of a run write to
	// the host (holes are free), unless the request sets its own cap.
	DefaultCopyOutMaxData = 4 << 30
)

// CopyOut names one guest file to copy to the host after the command.
type CopyOut struct {
	Guest string `json:"guest"`
	Host  string `json:"host"`
	// HostDir, when set, is Host's directory, opened by the caller; the
	// file is written in it under Host's last element, whatever the path
	// to it now resolves to.
	HostDir *os.File `json:"-"`
}

// Request is one run. The zero value of every optional field means its
// default.
type Request struct {
	Argv []string
	// Shell: Argv is a shell command line (/bin/sh -c CMD, as MCP's cmd
	// runs), refused before boot over a base without /bin/sh.
	Shell bool
	Stage string // default "base"
	// Base is the base a run from the empty stage boots, named by the
	// caller: it must be usable here, and must agree with a forked stage's
	// chain (a fork boots its chain's base).
	Base string
	// DefaultBase is the front end's default for a run from the empty
	// stage that names no Base (empty: DefaultBase, base-min). When it is
	// not usable here (not built, or stale), the run boots base-min
	// instead and its report warns, naming the command that builds it.
	DefaultBase string

	// The network (see NetworkMode): NoNetwork removes the NIC; otherwise
	// a run gets NAT, or filtered egress when DenyEgress is set or either
	// list is non-nil. A non-nil empty list asks for filtered egress too
	// (the way MCP's allow_hosts: [] does): with no rule in either list,
	// it denies everything, as DenyEgress.
	NoNetwork      bool
	AllowLANEgress bool
	AllowHosts     []string
	AllowCIDRs     []string
	DenyEgress     bool
	// Inject names credential aliases of the state root's store whose
	// endpoint the run's VM serves (credentials.go): filtered egress,
	// with nothing else allowed unless a list allows it. Refused with
	// NoNetwork. Caller says who named them.
	Inject []string
	Caller credential.Caller

	VCPUs      int
	MemMiB     int
	ScratchMiB int // 0: default (and warm-pool eligible)
	TimeoutS   int

	Env []string // KEY=VALUE
	Cwd string

	// Stdin feeds the command; the run closes it when it is an io.Closer.
	// A front end opens a host file for it through internal/hostio.
	Stdin io.Reader

	CopyOut []CopyOut
	// CopyOutMaxData caps the data bytes all copy-outs write to the host;
	// 0 means DefaultCopyOutMaxData.
	CopyOutMaxData int64
	CommitAs       string

	// Workspace, when set, copies a host directory into the run and can
	// bring its changes back as a patch (workspace.go).
	Workspace *workspace.Request

	// rules are the network switches parsed, by normalize: the one form
	// the run's network takes.
	rules egress.Rules
	// creds are Inject resolved, by admit, before any VM starts.
	creds []credential.Credential
	// Place is the admission place a front end took for the run (nil:
	// none). A ready VM whose place was lent to it is claimed by the run
	// or ended before the run's VM starts.
	Place *admission.Ticket
	// WaitPlace, when set, takes the run's VM place (a front end's wait
	// in the state root's ledger): Run calls it once the request is
	// checked, before anything of the VM starts, and fails with its
	// error.
	WaitPlace func(ctx context.Context) error
}
