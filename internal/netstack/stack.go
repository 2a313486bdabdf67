// Package netstack gives one QEMU guest rootless network access through a
// userspace TCP/IP stack (gVisor's netstack) that the isopod process owns.
//
// The guest's virtio-net NIC is a QEMU stream netdev connected to a unix
// socket the stack serves. The stack plays the guest's gateway: it answers
// ARP, ICMP echo to the gateway and DNS on gateway:53, and terminates every
// other TCP connection and UDP flow the guest opens, whatever its
// destination. For each one it asks the [egress.Policy]; a refused TCP
// connection gets a RST, an allowed one is dialled from the host as an
// ordinary socket and spliced to the guest, and every flow ends as one
// [flightrec.Event]. When the policy is an [egress.Sniffer] and asks for
// it, the connection is accepted first and read through a sniff.Guard, so
// that every name it carries is judged before, and while, it reaches the
// server (a refused HTTP request gets 403). No tap device, no packet
// filter, no privileges.
//
// Each VM has its own Stack, so guests cannot reach each other. IPv6 is not
// offered to the guest; ICMP beyond the gateway is not forwarded.
package netstack

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/header"
	"gvisor.dev/gvisor/pkg/tcpip/network/arp"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/icmp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"

	"isopod/internal/agentproto"
	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
)

const nicID tcpip.NICID = 1

// Summary is the traffic so far. Flows and Denied count every flow the
// stack judged (TCP, UDP, DNS queries, ICMP beyond the gateway); bytes are
// payload bytes, counted live.
type Summary struct {
	flightrec.Totals
	Active     int    `json:"active"`     // flows open now
	FramesIn   uint64 `json:"frames_in"`  // from the guest
	FramesOut  uint64 `json:"frames_out"` // to the guest
	FramesDrop uint64 `json:"frames_dropped"`
}

// Stack is one guest's network.
type Stack struct {
	cfg    Config
	log    *slog.Logger
	policy egress.Policy
	dns    DNSHandler
	start  time.Time

	ns   *stack.Stack
	link *link
	ln   net.Listener

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	flows   map[*flowState]struct{}
	closers []func() // gateway services
	closed  bool

	totalsMu sync.Mutex
	totals   flightrec.Totals
	bytesUp  atomic.Int64
	bytesDn  atomic.Int64

	quiet quietSet

	closeOnce sync.Once
	closeErr  error
}

// HostAddrs lists the host's own interface addresses, for
// egress.PublicOnly.HostAddrs.
func HostAddrs() ([]netip.Addr, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("listing host addresses: %w", err)
	}
	var out []netip.Addr
	for _, a := range addrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out, nil
}

// Listen makes a stack's socket at path (which must not exist) ahead of
// the stack: a VMM may connect at once, its connection waiting in the
// backlog until a Start with Config.Listener serves it. Closing the
// listener removes the socket.
func Listen(path string) (*net.UnixListener, error) {
	if _, err := os.Lstat(path); err == nil {
		return nil, fmt.Errorf("netstack socket %s already exists (remove it or use a fresh VM directory): %w", path, errdefs.ErrAlreadyExists)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on netstack socket: %w", err)
	}
	ln.SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o600); err != nil {
		ln.Close()
		return nil, fmt.Errorf("restricting netstack socket: %w", err)
	}
	return ln, nil
}

// Start builds the stack and listens on cfg.Socket (or serves
// cfg.Listener). The guest may connect at
// any time until Close; one connection is served at a time.
func Start(cfg Config) (*Stack, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Stack{cfg: cfg, log: cfg.Logger, policy: cfg.Policy, dns: cfg.DNS, start: time.Now(),
		flows: make(map[*flowState]struct{})}
	if s.policy == nil {
		hosts, err := HostAddrs()
		if err != nil {
			return nil, err
		}
		s.policy = &egress.PublicOnly{HostAddrs: hosts}
	}
	if s.dns == nil {
		s.dns = newResolverDNS(cfg.Resolver, cfg.ResolvConf, cfg.IPv6Answers, s.log)
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())

	if cfg.Listener != nil {
		s.ln = cfg.Listener
	} else {
		ln, err := Listen(cfg.Socket)
		if err != nil {
			s.cancel()
			return nil, err
		}
		s.ln = ln
	}

	if err := s.build(); err != nil {
		s.Close()
		return nil, err
	}
	s.wg.Add(1)
	go s.acceptLoop()
	s.log.Debug("netstack started", "socket", cfg.Socket, "guest", cfg.GuestAddr, "gateway", cfg.Gateway)
	return s, nil
}

func (s *Stack) build() error {
	cfg := s.cfg
	s.ns = stack.New(stack.Options{
		NetworkProtocols:   []stack.NetworkProtocolFactory{ipv4.NewProtocol, arp.NewProtocol},
		TransportProtocols: []stack.TransportProtocolFactory{tcp.NewProtocol, udp.NewProtocol, icmp.NewProtocol4},
	})
	if err := tuneTCP(s.ns); err != nil {
		return err
	}
	s.link = newLink(uint32(cfg.MTU), tcpip.LinkAddress(cfg.GatewayMAC), s.filterFrame)
	if err := s.ns.CreateNIC(nicID, s.link); err != nil {
		return fmt.Errorf("netstack: creating NIC: %s", err)
	}
	// Promiscuous: accept packets for any destination. Spoofing: answer
	// from that destination's address.
	if err := s.ns.SetPromiscuousMode(nicID, true); err != nil {
		return fmt.Errorf("netstack: promiscuous mode: %s", err)
	}
	if err := s.ns.SetSpoofing(nicID, true); err != nil {
		return fmt.Errorf("netstack: spoofing: %s", err)
	}
	gw := tcpip.AddrFrom4(cfg.Gateway.As4())
	prefix := tcpip.AddressWithPrefix{Address: gw, PrefixLen: cfg.GuestAddr.Bits()}
	if err := s.ns.AddProtocolAddress(nicID, tcpip.ProtocolAddress{Protocol: ipv4.ProtocolNumber, AddressWithPrefix: prefix}, stack.AddressProperties{}); err != nil {
		return fmt.Errorf("netstack: adding gateway address: %s", err)
	}
	s.ns.SetRouteTable([]tcpip.Route{{Destination: prefix.Subnet(), NIC: nicID}})
	guest := tcpip.AddrFrom4(cfg.GuestAddr.Addr().As4())
	if err := s.ns.AddStaticNeighbor(nicID, ipv4.ProtocolNumber, guest, tcpip.LinkAddress(cfg.GuestMAC)); err != nil {
		return fmt.Errorf("netstack: guest neighbour: %s", err)
	}

	tcpFwd := tcp.NewForwarder(s.ns, 0, 512, s.handleTCP)
	s.ns.SetTransportProtocolHandler(tcp.ProtocolNumber, tcpFwd.HandlePacket)
	udpFwd := udp.NewForwarder(s.ns, s.handleUDP)
	s.ns.SetTransportProtocolHandler(udp.ProtocolNumber, udpFwd.HandlePacket)
	return s.startDNS()
}

// tuneTCP sets the stack's TCP options for bulk throughput: SACK, large
// auto-tuned buffers, CUBIC.
func tuneTCP(ns *stack.Stack) error {
	opts := []tcpip.SettableTransportProtocolOption{
		new(tcpip.TCPSACKEnabled),
		&tcpip.TCPReceiveBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
		&tcpip.TCPSendBufferSizeRangeOption{Min: 4 << 10, Default: 1 << 20, Max: 8 << 20},
		new(tcpip.TCPModerateReceiveBufferOption),
	}
	*opts[0].(*tcpip.TCPSACKEnabled) = true
	*opts[3].(*tcpip.TCPModerateReceiveBufferOption) = true
	cc := tcpip.CongestionControlOption("cubic")
	// The stack is the closing side whenever the host's peer closes first;
	// a long TIME_WAIT would then swallow a guest SYN that reuses the port.
	tw := tcpip.TCPTimeWaitTimeoutOption(time.Second)
	opts = append(opts, &cc, &tw)
	for _, o := range opts {
		if err := ns.SetTransportProtocolOption(tcp.ProtocolNumber, o); err != nil {
			return fmt.Errorf("netstack: TCP option %T: %s", o, err)
		}
	}
	return nil
}

func (s *Stack) acceptLoop() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("netstack accept failed", "err", err)
			}
			return
		}
		s.log.Debug("guest link connected")
		if err := s.link.serve(c); err != nil && s.ctx.Err() == nil {
			s.log.Warn("guest link ended", "err", err)
		}
		c.Close()
	}
}

// filterFrame drops ICMP that is not for the gateway: without it the
// promiscuous stack would answer echo requests for every address and the
// guest would believe it reached hosts it did not.
func (s *Stack) filterFrame(frame []byte) bool {
	eth := header.Ethernet(frame)
	if eth.Type() == header.IPv6ProtocolNumber {
		s.noteIPv6(frame[header.EthernetMinimumSize:])
		return false
	}
	if eth.Type() != header.IPv4ProtocolNumber {
		return eth.Type() == header.ARPProtocolNumber
	}
	ip := header.IPv4(frame[header.EthernetMinimumSize:])
	if !ip.IsValid(len(ip)) {
		return false
	}
	dst := netip.AddrFrom4(ip.DestinationAddress().As4())
	proto := ip.TransportProtocol()
	if proto == header.ICMPv4ProtocolNumber {
		if dst == s.cfg.Gateway {
			return true
		}
		if s.quiet.first(egress.ProtoICMP, dst, 0) {
			s.refuse(flightrec.Event{Proto: egress.ProtoICMP, Dst: dst, Reason: egress.ReasonNotForwarded})
		}
		return false
	}
	// Destinations the stack would drop or answer itself (loopback,
	// unspecified, multicast, broadcast) never reach a forwarder; record
	// TCP and UDP attempts to them here.
	switch c := egress.Category(dst); c {
	case egress.CatLoopback, egress.CatUnspecified, egress.CatMulticast, egress.CatBroadcast:
		name := map[tcpip.TransportProtocolNumber]string{header.TCPProtocolNumber: egress.ProtoTCP, header.UDPProtocolNumber: egress.ProtoUDP}[proto]
		if name == "" || ip.More() || ip.FragmentOffset() != 0 {
			return false
		}
		var port uint16
		if p := ip.Payload(); len(p) >= 4 {
			port = uint16(p[2])<<8 | uint16(p[3])
		}
		if s.quiet.first(name, dst, port) {
			s.refuse(flightrec.Event{Proto: name, Dst: dst, Port: port, Reason: egress.CategoryReason(c)})
		}
		return false
	}
	return true
}

// NetConfig is what the guest agent needs to configure the NIC (the
// configure_net message): address, gateway, the gateway as DNS server, MAC.
func (s *Stack) NetConfig() agentproto.NetConfig {
	return agentproto.NetConfig{
		Address: s.cfg.GuestAddr.String(),
		Gateway: s.cfg.Gateway.String(),
		DNS:     []string{s.cfg.Gateway.String()},
		MAC:     s.cfg.GuestMAC.String(),
	}
}

// GuestIP is the guest's address (the report's guest_ip).
func (s *Stack) GuestIP() netip.Addr { return s.cfg.GuestAddr.Addr() }

// Socket is the unix socket path QEMU connects to.
func (s *Stack) Socket() string { return s.cfg.Socket }

// ListenTCP listens on the gateway address inside the guest's network (for
// services such as an HTTP proxy). Connections to the port no longer reach
// the Policy. The listener closes with the Stack.
func (s *Stack) ListenTCP(port uint16) (net.Listener, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("netstack listen: stack closed: %w", errdefs.ErrFailedPrecondition)
	}
	l, err := gonet.ListenTCP(s.ns, s.gatewayAddr(port), ipv4.ProtocolNumber)
	if err != nil {
		return nil, fmt.Errorf("netstack listen on gateway port %d: %w", port, err)
	}
	s.closers = append(s.closers, func() { l.Close() })
	return l, nil
}

func (s *Stack) gatewayAddr(port uint16) tcpip.FullAddress {
	return tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(s.cfg.Gateway.As4()), Port: port}
}

// Summary returns the traffic so far.
func (s *Stack) Summary() Summary {
	s.totalsMu.Lock()
	t := s.totals
	s.totalsMu.Unlock()
	t.BytesUp = s.bytesUp.Load()
	t.BytesDown = s.bytesDn.Load()
	s.mu.Lock()
	active := len(s.flows)
	s.mu.Unlock()
	return Summary{Totals: t, Active: active,
		FramesIn: s.link.framesIn.Load(), FramesOut: s.link.framesOut.Load(), FramesDrop: s.link.dropped.Load()}
}

// Close ends every flow and goroutine, closes the guest link and removes
// the socket. Idempotent; every call returns the same error.
func (s *Stack) Close() error {
	s.closeOnce.Do(func() {
		s.cancel()
		s.mu.Lock()
		s.closed = true
		flows := make([]*flowState, 0, len(s.flows))
		for f := range s.flows {
			flows = append(flows, f)
		}
		closers := s.closers
		s.closers = nil
		s.mu.Unlock()

		var errs []error
		if s.ln != nil {
			if err := s.ln.Close(); err != nil {
				errs = append(errs, fmt.Errorf("closing netstack socket: %w", err))
			}
		}
		for _, c := range closers {
			c()
		}
		for _, f := range flows {
			f.abort()
		}
		if s.link != nil {
			s.link.detach()
		}
		if s.ns != nil {
			s.ns.Close()
		}
		s.wg.Wait()
		if s.ns != nil {
			s.ns.Wait()
		}
		if err := os.Remove(s.cfg.Socket); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing netstack socket: %w", err))
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}

// emit counts ev and hands it to the recorder. Bytes were counted live.
func (s *Stack) emit(ev flightrec.Event) {
	s.totalsMu.Lock()
	s.totals.Flows++
	if !ev.Allowed {
		s.totals.Denied++
	}
	s.totalsMu.Unlock()
	if s.cfg.Recorder != nil {
		s.cfg.Recorder.Record(ev)
	}
}

// refuse records a refused flow.
func (s *Stack) refuse(ev flightrec.Event) {
	ev.Allowed = false
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	s.log.Debug("flow refused", "proto", ev.Proto, "dst", ev.Dst, "port", ev.Port, "reason", ev.Reason)
	s.emit(ev)
}
