// Package sandbox is isopod's one core: both the CLI and the MCP server call
// it. A [Service] runs one command in a fresh microVM per call, keeps stages,
// images and VM records under the state root, and returns a [report.Run]. It is
// the planner: it validates a request, plans its disks and VM, and hands the
// VM's life to internal/machine, which it gives the VMM driver that
// wiring.go picks.
package sandbox
