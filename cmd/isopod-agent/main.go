// Command isopod-agent is the guest agent: the static PID 1 of every isopod
// microVM. All of it lives in internal/agent.
//
// A guest's CPUs are fixed when it boots, so the runtime does not look for
// changes to them.
//
//go:debug updatemaxprocs=0
package main

import "isopod/internal/agent"

func main() {
	agent.Main()
}
