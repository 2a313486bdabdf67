package netstack

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/transport/udp"
	"gvisor.dev/gvisor/pkg/waiter"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// maxDatagram is the largest UDP payload relayed.
const maxDatagram = 65535

// handleUDP runs on the packet path for the first datagram of each new
// (guest port, destination) pair that no gateway service claims. It must not
// block: the flow itself runs in its own goroutines.
func (s *Stack) handleUDP(r *udp.ForwarderRequest) {
	src, dst := endpointAddrs(r.ID())
	ev := flightrec.Event{Time: time.Now(), Proto: egress.ProtoUDP, Dst: dst.Addr(), Port: dst.Port()}
	refuse := func(reason string) {
		if s.quiet.first(egress.ProtoUDP, dst.Addr(), dst.Port()) {
			ev.Reason = reason
			s.refuse(ev)
		}
	}
	if dst.Addr() == s.cfg.Gateway || s.cfg.GuestAddr.Contains(dst.Addr()) {
		refuse(egress.ReasonGatewayPort)
		return
	}
	v := s.policy.Decide(egress.Flow{Proto: egress.ProtoUDP, Src: src, Dst: dst})
	ev.Host = v.Host
	if !v.Allow {
		refuse(v.Reason)
		return
	}
	ev.Reason = v.Reason
	f := &flowState{}
	if ok, reason := s.track(f); !ok {
		refuse(reason)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		s.untrack(f)
		ev.Allowed, ev.Error = true, "guest endpoint: "+terr.String()
		s.emit(ev)
		return
	}
	guest := gonet.NewUDPConn(&wq, ep)
	target := dialTarget(v, dst)
	go func() {
		defer s.untrack(f)
		s.relayUDP(f, ev, guest, target.String())
	}()
}

// relayUDP moves datagrams both ways until the flow has been idle for
// UDPIdleTimeout, then records it.
func (s *Stack) relayUDP(f *flowState, ev flightrec.Event, guest *gonet.UDPConn, target string) {
	var (
		up, down atomic.Int64
		last     atomic.Int64 // unix nanoseconds of the last datagram either way
	)
	last.Store(time.Now().UnixNano())
	host, err := net.Dial("udp", target)
	if err != nil {
		guest.Close()
		ev.Allowed, ev.Reason, ev.Error = true, egress.ReasonDialFailed, err.Error()
		s.emit(ev)
		return
	}
	var once sync.Once
	stop := func() { once.Do(func() { guest.Close(); host.Close() }) }
	f.onAbort(stop)
	idle := s.cfg.UDPIdleTimeout
	pump := func(dst, src net.Conn, n *atomic.Int64, total *atomic.Int64) {
		buf := make([]byte, maxDatagram)
		for {
			src.SetReadDeadline(time.Now().Add(idle))
			k, err := src.Read(buf)
			if err != nil {
				if isTimeout(err) && time.Since(time.Unix(0, last.Load())) < idle {
					continue
				}
				stop()
				return
			}
			last.Store(time.Now().UnixNano())
			if _, err := dst.Write(buf[:k]); err == nil {
				n.Add(int64(k))
				total.Add(int64(k))
			}
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); pump(host, guest, &up, &s.bytesUp) }()
	go func() { defer wg.Done(); pump(guest, host, &down, &s.bytesDn) }()
	wg.Wait()

	ev.Allowed = true
	ev.BytesUp, ev.BytesDown = up.Load(), down.Load()
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	s.emit(ev)
}
