package sandbox

import (
	"time"

	"isopod/internal/egress"
	"isopod/internal/vmnet"
)

// startNetwork starts a run's network under rules, the request's parsed
// network policy (the zero Rules: NAT), serving the parked socket nic (nil:
// a new one), with the endpoint of the credentials it injects.
func (s *Service) startNetwork(nic *vmnet.NIC, id, dir string, rules egress.Rules, start time.Time, creds ...vmnet.Credential) (*vmnet.Network, error) {
	return vmnet.Start(s.netConfig(nic, id, dir, rules, start, creds))
}

// netConfig is the network of VM id in dir.
func (s *Service) netConfig(nic *vmnet.NIC, id, dir string, rules egress.Rules, start time.Time, creds []vmnet.Credential) vmnet.Config {
	return vmnet.Config{Scope: s.opts.Paths.Scope(), ID: id, Dir: dir,
		Rules: rules, Start: start, NIC: nic, Credentials: creds, CredentialMaxBody: s.opts.CredentialMaxBody, Logger: s.log}
}
