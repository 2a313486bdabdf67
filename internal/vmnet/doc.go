// Package vmnet is one VM's network: a userspace stack of its own (so no
// guest reaches another), NAT to public addresses or filtered egress with
// its HTTP and SOCKS proxies and resolver on the gateway, the flight
// recorder of every flow, and, for a run that injects credentials, the
// credential endpoint on the gateway with the credentials' hosts pinned.
// The NIC's socket may be parked before the VM starts (a ready VM's), and
// the network outlives the VMM it was started for, so that a snapshot's
// clone can take it over.
package vmnet
