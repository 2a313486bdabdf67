// Package machine holds one VM's life over the vmm contract: its network
// (internal/vmnet, started by the caller and handed in), the VMM process the caller's vmm.Driver starts, the agent client on its
// channel, and the captures of what its commands print. The core
// (internal/sandbox) plans a run and hands it to a Machine; the Machine
// reads no settings and names no VMM driver. A VM kept across calls (a
// session) also has background jobs, copy-in and guest ports exposed on
// host listeners (session_calls.go, expose.go).
package machine
