package netstack

import (
	"context"
	"errors"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/stack"
	"gvisor.dev/gvisor/pkg/tcpip/transport/tcp"
	"gvisor.dev/gvisor/pkg/waiter"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/sniff"
)

// Sniffing bounds: how much of a connection's start a Sniffer may see, and
// how long the guest has to send it.
const (
	sniffCap     = 16 << 10
	sniffTimeout = 10 * time.Second
)

// copyBufSize is the buffer each direction of a spliced connection uses.
const copyBufSize = 128 << 10

var copyBufs = sync.Pool{New: func() any { b := make([]byte, copyBufSize); return &b }}

func endpointAddrs(id stack.TransportEndpointID) (src, dst netip.AddrPort) {
	src = netip.AddrPortFrom(netip.AddrFrom4(id.RemoteAddress.As4()), id.RemotePort)
	dst = netip.AddrPortFrom(netip.AddrFrom4(id.LocalAddress.As4()), id.LocalPort)
	return src, dst
}

// handleTCP runs, in its own goroutine, for each SYN that no gateway
// service claims.
func (s *Stack) handleTCP(r *tcp.ForwarderRequest) {
	src, dst := endpointAddrs(r.ID())
	start := time.Now()
	ev := flightrec.Event{Time: start, Proto: egress.ProtoTCP, Dst: dst.Addr(), Port: dst.Port()}
	if dst.Addr() == s.cfg.Gateway || s.cfg.GuestAddr.Contains(dst.Addr()) {
		r.Complete(true)
		ev.Reason = egress.ReasonGatewayPort
		s.refuse(ev)
		return
	}
	f := &flowState{}
	if ok, reason := s.track(f); !ok {
		r.Complete(true)
		ev.Reason = reason
		s.refuse(ev)
		return
	}
	defer s.untrack(f)

	flow := egress.Flow{Proto: egress.ProtoTCP, Src: src, Dst: dst}
	v := s.policy.Decide(flow)
	ev.Host, ev.Reason = v.Host, v.Reason
	if !v.Allow {
		r.Complete(true)
		s.refuse(ev)
		return
	}
	if sn, ok := s.policy.(egress.Sniffer); ok && v.Sniff {
		s.sniffTCP(r, f, sn, flow, ev)
		return
	}

	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	host, err := s.dialTCP(ctx, dialTarget(v, dst))
	cancel()
	if err != nil {
		r.Complete(true)
		ev.Allowed, ev.Reason, ev.Error = true, egress.ReasonDialFailed, err.Error()
		ev.DurationMS = time.Since(start).Milliseconds()
		s.emit(ev)
		return
	}
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		host.Close()
		ev.Allowed, ev.Error = true, "guest handshake: "+terr.String()
		ev.DurationMS = time.Since(start).Milliseconds()
		s.emit(ev)
		return
	}
	r.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	s.splice(f, ev, guest, ep, host, nil)
}

// sniffTCP accepts the connection in the stack, lets the Sniffer judge its
// first bytes, and only then dials.
func (s *Stack) sniffTCP(r *tcp.ForwarderRequest, f *flowState, sn egress.Sniffer, flow egress.Flow, ev flightrec.Event) {
	var wq waiter.Queue
	ep, terr := r.CreateEndpoint(&wq)
	if terr != nil {
		r.Complete(true)
		ev.Allowed, ev.Error = true, "guest handshake: "+terr.String()
		s.emit(ev)
		return
	}
	r.Complete(false)
	guest := gonet.NewTCPConn(&wq, ep)
	f.onAbort(func() { ep.Abort() })
	refuse := func(reason, errText string) {
		ep.Abort() // RST
		ev.Reason, ev.Error = reason, errText
		ev.DurationMS = time.Since(ev.Time).Milliseconds()
		s.refuse(ev)
	}

	head := make([]byte, 0, 4096)
	deadline := time.Now().Add(sniffTimeout)
	guest.SetReadDeadline(deadline)
	var v egress.Verdict
	for {
		if len(head) == cap(head) {
			head = append(head, make([]byte, min(cap(head), sniffCap-len(head)))...)[:len(head)]
		}
		n, err := guest.Read(head[len(head):cap(head)])
		head = head[:len(head)+n]
		name, from, perr := sniff.HeadName(head)
		more := sniff.NeedMore(perr)
		if !more || err != nil || len(head) >= sniffCap {
			if perr != nil {
				name = ""
			}
			fl := flow
			fl.Host, fl.HostFrom = name, from
			v = sn.Sniff(fl)
			break
		}
	}
	guest.SetReadDeadline(time.Time{})
	if v.Host != "" {
		ev.Host = v.Host
	}
	if !v.Allow {
		refuse(v.Reason, "")
		return
	}
	ev.Reason = v.Reason
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	host, err := s.dialTCP(ctx, dialTarget(v, flow.Dst))
	cancel()
	if err != nil {
		ev.Allowed = true
		refuse(egress.ReasonDialFailed, err.Error())
		return
	}
	s.splice(f, ev, guest, ep, host, head)
}

func dialTarget(v egress.Verdict, dst netip.AddrPort) netip.AddrPort {
	if v.Dial.IsValid() {
		return v.Dial
	}
	return dst
}

func (s *Stack) dialTCP(ctx context.Context, dst netip.AddrPort) (*net.TCPConn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", dst.String())
	if err != nil {
		return nil, err
	}
	return c.(*net.TCPConn), nil
}

// splice copies both ways until both directions end (or one fails), then
// records the flow. head is sent to the host first (bytes a Sniffer read).
func (s *Stack) splice(f *flowState, ev flightrec.Event, guest *gonet.TCPConn, ep tcpip.Endpoint, host *net.TCPConn, head []byte) {
	var abortOnce sync.Once
	abort := func() {
		abortOnce.Do(func() {
			ep.Abort()
			host.SetLinger(0)
			host.Close()
		})
	}
	f.onAbort(abort)

	var up, down atomic.Int64
	var failed atomic.Bool
	var firstErr atomic.Value
	fail := func(err error) {
		if failed.CompareAndSwap(false, true) {
			firstErr.Store(err.Error())
			abort()
		}
	}
	if len(head) > 0 {
		n, err := host.Write(head)
		up.Add(int64(n))
		s.bytesUp.Add(int64(n))
		if err != nil {
			fail(err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := s.copyCount(host, guest, &up, &s.bytesUp); err != nil {
			fail(err)
			return
		}
		host.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		if err := s.copyCount(guest, host, &down, &s.bytesDn); err != nil {
			fail(err)
			return
		}
		guest.CloseWrite()
	}()
	wg.Wait()
	guest.Close()
	host.Close()

	ev.Allowed = true
	ev.BytesUp, ev.BytesDown = up.Load(), down.Load()
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	if e, ok := firstErr.Load().(string); ok && s.ctx.Err() == nil {
		ev.Error = e
	}
	s.emit(ev)
}

// copyCount copies src to dst until EOF, adding every byte written to both
// counters. It returns nil at EOF.
func (s *Stack) copyCount(dst io.Writer, src io.Reader, flow, total *atomic.Int64) error {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	buf := *bp
	for {
		n, rerr := src.Read(buf)
		if n > 0 {
			w, werr := dst.Write(buf[:n])
			flow.Add(int64(w))
			total.Add(int64(w))
			if werr != nil {
				return werr
			}
		}
		if rerr != nil {
			if errors.Is(rerr, io.EOF) {
				return nil
			}
			return rerr
		}
	}
}
