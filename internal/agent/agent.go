// Package agent is isopod's guest agent: the static PID 1 that runs inside
// every microVM.
//
// As PID 1 ([Main] with os.Getpid() == 1) it mounts the kernel filesystems,
// loads the kernel modules listed in /etc/isopod/modules, finds the disks by
// their virtio serials, assembles the overlay root, switches into it, reaps
// every orphan and then serves the agentproto protocol on the virtio-serial
// port named isopod.agent until the host asks it to halt. A [Server]
// outlives its connections: background jobs and the processes that kept
// execs left live in it, and the port is served again when a session's
// connection ends (see agentproto's Sessions).
//
// The protocol side ([Serve], [Server]) also runs as a plain process: with
// Options.ReapAll false it waits for each child by pid and never touches the
// machine unless a [System] is given, so tests drive it over a socket pair
// and run real host programs; [Server.KillAll] then ends what would
// outlive it.
//
// The package imports only the standard library, golang.org/x/sys,
// isopod/internal/agentproto and isopod/internal/errdefs, so the agent links
// statically without cgo.
package agent

import (
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// Version is the agent's build version, announced in Hello. Set it with
// -ldflags "-X isopod/internal/agent.Version=...".
var Version = "dev"

// protoVersionOverride, when set at link time to an integer, replaces
// agentproto.Version in every Hello. Tests of the host's version check use
// it: -ldflags "-X isopod/internal/agent.protoVersionOverride=999".
var protoVersionOverride string

// ProtoVersion is the protocol version this agent announces.
func ProtoVersion() int {
	if protoVersionOverride != "" {
		if v, err := strconv.Atoi(protoVersionOverride); err == nil {
			return v
		}
	}
	return agentproto.Version
}

// DefaultHello describes this agent and the running kernel: protocol and
// agent versions, uptime and kernel release. Boot results (BootError,
// ModulesMS) are added by the PID-1 code.
//
// It is the readiness probe after a snapshot resume, when every code path
// runs for the first time in a fresh emulator process, so it makes one
// cheap syscall: the kernel release is read once and kept.
func DefaultHello() agentproto.Hello {
	return agentproto.Hello{
		Version:      ProtoVersion(),
		AgentVersion: Version,
		UptimeMS:     uptimeMS(),
		Kernel:       kernelRelease(),
	}
}

var kernelRelease = sync.OnceValue(func() string {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return ""
	}
	return unix.ByteSliceToString(u.Release[:])
})

// uptimeMS is the time since boot (CLOCK_BOOTTIME); 0 when unavailable.
func uptimeMS() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0
	}
	return ts.Nano() / int64(time.Millisecond)
}
