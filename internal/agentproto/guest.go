package agentproto

import "strconv"

// The guest contract beyond protocol messages: how the guest finds its agent
// channel and its disks, and the kernel command-line keys the agent reads.
// The host builds VMs from these names and the guest looks for them; both
// read them from here only.

// PortName is the name of the virtio-serial port the agent serves on
// (/sys/class/virtio-ports/vport*/name).
const PortName = "isopod.agent"

// Disk serials, read by the guest from /sys/block/vdX/serial. Disks are found
// by serial, never by order.
const (
	// SerialBase is the base image: squashfs, read-only.
	SerialBase = "isopod-base"
	// SerialScratch is the run's fresh ext4, read-write: the overlay's
	// upper layer and, when committed, the new stage layer.
	SerialScratch = "isopod-scratch"
	// serialLayerPrefix + index is a stage layer (ext4, read-only).
	serialLayerPrefix = "isopod-l"
	// SerialWorkspace is a workspace: a squashfs of the host tree,
	// read-only.
	SerialWorkspace = "isopod-ws"
	// SerialWorkspaceUpper is the workspace's own writable layer (ext4),
	// never committed.
	SerialWorkspaceUpper = "isopod-ws-upper"
)

// MaxLayers is how many stage layers one guest mounts (one virtio disk
// each), so it caps a stage chain.
const MaxLayers = 10

// LayerSerial is the serial of stage layer i; 0 is the oldest, closest to
// the base.
func LayerSerial(i int) string { return serialLayerPrefix + strconv.Itoa(i) }

// Kernel command-line keys the agent reads. Everything else (the disks of
// the root, network, clock, hostname, entropy) arrives as protocol messages
// so that a resumed snapshot can be reconfigured.
const (
	// CmdlineHostname is the hostname set at boot.
	CmdlineHostname = "isopod.hostname"
	// CmdlineDebug set to "1" adds debug lines to the console.
	CmdlineDebug = "isopod.debug"
)

// AgentDebugEnv set to "1" in the environment of an agent serving on its
// own stdio (isopod-agent --stdio, for development) adds debug lines to
// its log. The agent reads it itself; internal/knobs names it for users.
const AgentDebugEnv = "ISOPOD_AGENT_DEBUG"

// BaseMountPoint is where the guest mounts the base image at boot, before
// the root is assembled; the host reads files of the base there to warm
// the page cache of a snapshot VM.
const BaseMountPoint = "/run/isopod/base"

// WorkspaceMountPoint is where the workspace's disks are mounted in the
// guest before its overlay is assembled at the workspace directory.
const WorkspaceMountPoint = "/run/isopod/workspace"

// FloorArg, given to the guest's init after "--" on the kernel command line,
// makes it power off at once: the floor a boot is measured against.
const FloorArg = "isopod-floor"
