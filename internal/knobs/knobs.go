// Package knobs names every environment variable isopod honours. It reads
// nothing: internal/config reads them once, at the front ends, and the
// packages below name them only in messages that tell a user what to set.
package knobs

import "isopod/internal/agentproto"

const (
	Home                 = "ISOPOD_HOME"                    // state root; default ~/.isopod
	Kernel               = "ISOPOD_KERNEL"                  // a kernel with every driver built in
	QEMU                 = "ISOPOD_QEMU"                    // qemu-system-x86_64 to use
	VMM                  = "ISOPOD_VMM"                     // the VMM driver: qemu (the default and only one)
	AgentBin             = "ISOPOD_AGENT_BIN"               // isopod-agent binary for image builds
	Accel                = "ISOPOD_ACCEL"                   // force "kvm" or "tcg"
	AllowBaseSkew        = "ISOPOD_ALLOW_BASE_SKEW"         // "1": fork stages made over another base build
	LogLevel             = "ISOPOD_LOG"                     // debug|info|warn|error (stderr)
	Jail                 = "ISOPOD_JAIL"                    // 1|on: confine the VMM (the default); 0|off: unconfined, with a warning
	WarmPool             = "ISOPOD_WARM_POOL"               // 0|off: every run boots cold and no snapshot is built
	WarmPoolDisk         = "ISOPOD_WARM_POOL_DISK_MIB"      // the snapshots' disk budget; least recently used go first
	CredentialMaxBodyMiB = "ISOPOD_CREDENTIAL_MAX_BODY_MIB" // the largest request body through the credential endpoint (default 256)
	ReadyVMs             = "ISOPOD_READY_VMS"               // isopod-mcp: running VMs kept ready per hot shape (default 1; 0 off)
	MaxVMs               = "ISOPOD_MAX_VMS"                 // VMs every process under the state root keeps at once (default: from the host)
	MemoryBudgetMiB      = "ISOPOD_MEMORY_BUDGET_MIB"       // what those VMs may cost together (default: MemTotal less an eighth)
	SessionMaxLifetimeS  = "ISOPOD_SESSION_MAX_LIFETIME_S"  // the longest --max-lifetime-s a session may ask for (default 86400)
	SessionDiskBudgetMiB = "ISOPOD_SESSION_DISK_BUDGET_MIB" // what paused sessions may hold on disk together (default 20480; 0: no budget)
	MCPHostIORoot        = "ISOPOD_MCP_HOST_IO_ROOT"
	MCPCopyOut           = "ISOPOD_MCP_COPY_OUT"
	MCPStdinFile         = "ISOPOD_MCP_STDIN_FILE"
	MCPWorkspace         = "ISOPOD_MCP_WORKSPACE" // 0|off: sandbox_run refuses workspace
)

// DockerConfig is Docker's configuration directory, whose config.json and
// credential helpers give registry credentials (image import, stage push
// and pull); default ~/.docker.
const DockerConfig = "DOCKER_CONFIG"

// Registry stalls: a registry request (image import, stage push and pull)
// that moves no data for RegistryStallS seconds, or less than
// RegistryMinKiBps KiB a second over that window, fails as unavailable.
const (
	RegistryStallS   = "ISOPOD_REGISTRY_STALL_S"   // the window in seconds (default 60)
	RegistryMinKiBps = "ISOPOD_REGISTRY_MIN_KIBPS" // the floor in KiB/s (default 10; 0: only silence counts)
)

// AgentDebug set to "1" makes an isopod-agent serving on its own stdio
// (--stdio, for development) log debug lines. The guest agent reads it
// itself and may not import this package, so the name lives in
// internal/agentproto.
const AgentDebug = agentproto.AgentDebugEnv
