// Command isopod-agent is the guest agent: the static PID 1 of every isopod
// microVM. All of it lives in internal/agent.
package main

import "isopod/internal/agent"

func main() {
	agent.Main()
}
