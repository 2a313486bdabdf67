package sandbox

import (
	"fmt"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// runNetwork is a run's network: its own userspace stack and recorder.
type runNetwork struct{}

func (s *Service) startNetwork(id, dir string, req Request) (*runNetwork, error) {
	return nil, fmt.Errorf("networking is not available yet: pass --no-network: %w", errdefs.ErrNotSupported)
}

func (n *runNetwork) vmmNet() *vmm.Net                   { return nil }
func (n *runNetwork) agentConfig() *agentproto.NetConfig { return nil }
func (n *runNetwork) guestIP() string                    { return "" }
func (n *runNetwork) report() *NetReport                 { return nil }
func (n *runNetwork) egressReport() any                  { return nil }
func (n *runNetwork) close()                             {}
