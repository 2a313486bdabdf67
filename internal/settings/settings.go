// Package settings is what isopod's behaviour depends on outside a
// request, as one typed value. internal/config fills it once, from the
// environment and the flags, at the front ends; the core takes it whole
// (sandbox.Options embeds it) and the host-I/O policy reads its switches
// from it. The package reads nothing itself.
package settings

import (
	"isopod/internal/oci"
	"isopod/internal/paths"
	"isopod/internal/vmm"
)

// Settings are the values the environment (internal/knobs names each
// variable) and the front ends' flags give.
type Settings struct {
	// Paths is the state root's layout (ISOPOD_HOME, else ~/.isopod).
	Paths paths.Paths
	// DockerConfig is the directory of Docker's config.json, whose
	// credentials image import and stage transfers use (DOCKER_CONFIG,
	// else ~/.docker); empty: anonymous.
	DockerConfig string
	// Kernel is a custom guest kernel with every driver built in
	// (--kernel, ISOPOD_KERNEL), absolute; empty: the fetched one.
	Kernel string
	// QEMU is the VMM binary (ISOPOD_QEMU); empty: qemu-system-x86_64 on PATH.
	QEMU string
	// VMM names the VMM driver (ISOPOD_VMM; sandbox.VMMDrivers); empty:
	// the default.
	VMM string
	// AgentBin is the guest agent for image builds (ISOPOD_AGENT_BIN);
	// empty: next to the running binary, else on PATH.
	AgentBin string
	// Accel forces an accelerator (ISOPOD_ACCEL); empty: KVM when usable.
	Accel vmm.Accel
	// AllowBaseSkew lets forks boot over a rebuilt base
	// (ISOPOD_ALLOW_BASE_SKEW=1).
	AllowBaseSkew bool
	// Jail says whether the VMM runs inside its jail (ISOPOD_JAIL).
	Jail JailMode
	// NoWarmPool makes every run boot cold and builds no snapshot
	// (ISOPOD_WARM_POOL=off).
	NoWarmPool bool
	// WarmPoolBytes is the disk budget of the warm pool's snapshots; the
	// least recently used go first (ISOPOD_WARM_POOL_DISK_MIB). 0: none.
	WarmPoolBytes int64
	// CredentialMaxBody caps a request body sent through the credential
	// endpoint (ISOPOD_CREDENTIAL_MAX_BODY_MIB); 0: the endpoint's default.
	CredentialMaxBody int64
	// SessionDiskBudget caps what paused sessions hold on disk together
	// (ISOPOD_SESSION_DISK_BUDGET_MIB); 0: no cap.
	SessionDiskBudget int64
	// ReadyVMs is how many restored, paused VMs a long-lived front end
	// keeps for each hot shape (ISOPOD_READY_VMS); 0: none.
	ReadyVMs int
	// MaxVMs and MemoryBudgetMiB bound the VMs every isopod process under
	// the state root keeps at once, counted in its ledger, and what they
	// cost together (ISOPOD_MAX_VMS, ISOPOD_MEMORY_BUDGET_MIB; isopod-mcp's
	// --max-vms and --memory-budget-mib override them); 0: from the host.
	MaxVMs          int
	MemoryBudgetMiB int
	// SessionMaxLifetimeS caps the lifetime a session may ask for
	// (ISOPOD_SESSION_MAX_LIFETIME_S).
	SessionMaxLifetimeS int
	// RegistryStall is how little a registry request may move before it
	// fails as unavailable (ISOPOD_REGISTRY_STALL_S,
	// ISOPOD_REGISTRY_MIN_KIBPS); zero: oci.DefaultStall.
	RegistryStall oci.Stall
	// HostIO are the MCP server's switches for the tool arguments that
	// name host files (internal/hostio applies them).
	HostIO HostIO
	// LookupEnv is the front end's environment, read only for the
	// secrets of the credentials a run injects (a store's env:NAME
	// sources); nil: no variable is set.
	LookupEnv func(string) (string, bool)
}

// JailMode is whether a VMM runs confined by isopod's jail.
type JailMode uint8

const (
	// JailDefault: the setting is unset, which means JailOn.
	JailDefault JailMode = iota
	// JailOn confines every VMM (ISOPOD_JAIL=1 or on).
	JailOn
	// JailOff runs VMMs unconfined and says so in every run's report
	// (ISOPOD_JAIL=0 or off).
	JailOff
)

// HostIO are the MCP server's host-I/O settings, as read; the policy in
// force (internal/hostio) is made from them and the server's flags.
type HostIO struct {
	// Root is the confinement root as given (ISOPOD_MCP_HOST_IO_ROOT);
	// RootSet says whether it was set at all (set but empty falls back
	// to the working directory, with a warning).
	Root    string
	RootSet bool
	// StdinFile, CopyOut and Workspace switch each argument on
	// (ISOPOD_MCP_STDIN_FILE, ISOPOD_MCP_COPY_OUT, ISOPOD_MCP_WORKSPACE;
	// unset: on).
	StdinFile bool
	CopyOut   bool
	Workspace bool
	// Warnings say which switch had a value that is neither on nor off
	// (read as off), for the start-up log.
	Warnings []string
}
