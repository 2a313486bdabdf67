package netstack

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"path/filepath"
	"time"

	"github.com/miekg/dns"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
)

// Defaults. Every VM has its own stack, so every VM can use the same subnet:
// the guest is 10.0.2.2/30 and the gateway 10.0.2.1.
var (
	DefaultGuestAddr  = netip.MustParsePrefix("10.0.2.2/30")
	DefaultGateway    = netip.MustParseAddr("10.0.2.1")
	DefaultGuestMAC   = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x56}
	DefaultGatewayMAC = net.HardwareAddr{0x52, 0x54, 0x00, 0x12, 0x34, 0x01}
)

// More defaults and limits.
const (
	DefaultMTU            = 1500
	MinMTU                = 576
	MaxMTU                = 65000
	DefaultDialTimeout    = 10 * time.Second
	DefaultUDPIdleTimeout = 60 * time.Second
	DefaultMaxFlows       = 1024
	DefaultResolvConf     = "/etc/resolv.conf"
	// maxSocketPath is the room in a unix socket address (sun_path less NUL).
	maxSocketPath = 107
)

// DNSHandler answers the guest's DNS queries at the gateway. It is called
// only for queries the Policy allowed, with one question each, and returns
// the reply (nil means SERVFAIL). It must honour ctx.
type DNSHandler interface {
	ServeDNS(ctx context.Context, src netip.AddrPort, q *dns.Msg) *dns.Msg
}

// Config describes one guest's network.
type Config struct {
	// Socket is the unix socket path the stack listens on. QEMU connects to
	// it as a client:
	//   -netdev stream,id=n0,server=off,addr.type=unix,addr.path=SOCKET
	// It must not exist yet; Close removes it.
	Socket string
	// Listener, when set, is Socket made ahead by Listen (a VMM may be
	// connected already); the stack serves it and closes it on Close.
	Listener *net.UnixListener

	// GuestAddr is the guest's address with its prefix; Gateway the stack's
	// own address in the same subnet (DNS, ICMP echo). Zero: the defaults.
	GuestAddr netip.Prefix
	Gateway   netip.Addr
	// GuestMAC is the guest NIC's address (it saves an ARP exchange);
	// GatewayMAC the stack's. Nil: the defaults.
	GuestMAC   net.HardwareAddr
	GatewayMAC net.HardwareAddr
	// MTU of the guest link, IP layer. 0: DefaultMTU.
	MTU int

	// Policy decides every flow. Nil: egress.PublicOnly with the host's
	// addresses from HostAddrs.
	Policy egress.Policy
	// Recorder gets one event per flow (nil: counted in Summary only).
	Recorder flightrec.Recorder
	// Resolver answers A queries (and AAAA when IPv6Answers); nil: the
	// host's resolver (net.DefaultResolver).
	Resolver *net.Resolver
	// ResolvConf names the host resolver configuration whose nameservers get
	// DNS queries of other types verbatim. "": DefaultResolvConf.
	ResolvConf string
	// DNS replaces the default DNS handler (Resolver + ResolvConf); see
	// ResolverHandler for a policy that answers with addresses.
	DNS DNSHandler
	// IPv6Answers makes the default handler answer AAAA queries. Off by
	// default: the guest has no IPv6 route, so it gets an empty answer and
	// does not try IPv6 first.
	IPv6Answers bool

	// DialTimeout bounds each outbound TCP connect. 0: DefaultDialTimeout.
	DialTimeout time.Duration
	// UDPIdleTimeout ends a UDP flow without traffic. 0: DefaultUDPIdleTimeout.
	UDPIdleTimeout time.Duration
	// MaxFlows caps concurrent TCP and UDP flows; more are refused.
	// 0: DefaultMaxFlows.
	MaxFlows int

	Logger *slog.Logger
}

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	if !c.GuestAddr.IsValid() {
		c.GuestAddr = DefaultGuestAddr
	}
	if !c.Gateway.IsValid() {
		c.Gateway = DefaultGateway
	}
	if c.GuestMAC == nil {
		c.GuestMAC = DefaultGuestMAC
	}
	if c.GatewayMAC == nil {
		c.GatewayMAC = DefaultGatewayMAC
	}
	if c.MTU == 0 {
		c.MTU = DefaultMTU
	}
	if c.Resolver == nil {
		c.Resolver = net.DefaultResolver
	}
	if c.ResolvConf == "" {
		c.ResolvConf = DefaultResolvConf
	}
	if c.DialTimeout == 0 {
		c.DialTimeout = DefaultDialTimeout
	}
	if c.UDPIdleTimeout == 0 {
		c.UDPIdleTimeout = DefaultUDPIdleTimeout
	}
	if c.MaxFlows == 0 {
		c.MaxFlows = DefaultMaxFlows
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks c as given; zero fields stand for their defaults.
func (c *Config) Validate() error {
	d := c.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf("netstack config: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case c.Socket == "":
		return bad("no socket path (give a path in the VM's directory)")
	case !filepath.IsAbs(c.Socket):
		return bad("socket path %q must be absolute", c.Socket)
	case len(c.Socket) > maxSocketPath:
		return bad("socket path %q is %d bytes; unix sockets allow %d (use a shorter state directory)", c.Socket, len(c.Socket), maxSocketPath)
	case !d.GuestAddr.Addr().Is4() || d.GuestAddr.Bits() > 30 || d.GuestAddr.Bits() < 8:
		return bad("guest address %v must be IPv4 with a prefix between /8 and /30", d.GuestAddr)
	case !d.Gateway.Is4() || !d.GuestAddr.Contains(d.Gateway) || d.Gateway == d.GuestAddr.Addr():
		return bad("gateway %v must be an IPv4 address in %v other than the guest's", d.Gateway, d.GuestAddr)
	case !usable(d.GuestAddr, d.GuestAddr.Addr()) || !usable(d.GuestAddr, d.Gateway):
		return bad("guest %v and gateway %v must not be the network or broadcast address of their subnet", d.GuestAddr, d.Gateway)
	case len(d.GuestMAC) != 6 || len(d.GatewayMAC) != 6 || d.GuestMAC[0]&1 == 1 || d.GatewayMAC[0]&1 == 1:
		return bad("MACs %v and %v must be 6-byte unicast addresses", d.GuestMAC, d.GatewayMAC)
	case d.MTU < MinMTU || d.MTU > MaxMTU:
		return bad("MTU %d out of range [%d, %d]", d.MTU, MinMTU, MaxMTU)
	case d.DialTimeout < 0 || d.UDPIdleTimeout < 0 || d.MaxFlows < 0:
		return bad("timeouts and flow limit must not be negative (0 means the default)")
	}
	return nil
}

// usable reports whether a is neither the network nor the broadcast address
// of p.
func usable(p netip.Prefix, a netip.Addr) bool {
	network := p.Masked().Addr()
	b := network.As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := (uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])) | host
	bcast := netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	return a != network && a != bcast
}
