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

// sniffTimeout is how long a guest has to send the first request (or
// ClientHello) of a connection that must carry its name.
const sniffTimeout = 10 * time.Second

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

// sniffTCP accepts the connection in the stack, has the names its first
// request (or ClientHello) carries judged by the Sniffer, and only then
// dials. Later requests on the connection are judged as they come (see
// sniff.Guard).
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
	guard := sniff.NewGuard(guest, sniff.Config{Strict: true, Judge: func(raw, from string) egress.Verdict {
		fl := flow
		fl.Host, fl.HostFrom = raw, from
		return sn.Sniff(fl)
	}})
	guest.SetReadDeadline(time.Now().Add(sniffTimeout))
	v, err := guard.First()
	guest.SetReadDeadline(time.Time{})
	if err != nil {
		s.refuseSniffed(guest, ep, ev, err)
		return
	}
	if v.Host != "" {
		ev.Host = v.Host
	}
	ev.Reason = v.Reason
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.DialTimeout)
	host, err := s.dialTCP(ctx, dialTarget(v, flow.Dst))
	cancel()
	if err != nil {
		ep.Abort() // RST
		ev.Allowed, ev.Reason, ev.Error = true, egress.ReasonDialFailed, err.Error()
		ev.DurationMS = time.Since(ev.Time).Milliseconds()
		s.emit(ev)
		return
	}
	s.splice(f, ev, guest, ep, host, guard)
}

// refuseSniffed refuses a connection whose first request (or ClientHello)
// failed: an HTTP request gets 403, anything else a RST. One record.
func (s *Stack) refuseSniffed(guest *gonet.TCPConn, ep tcpip.Endpoint, ev flightrec.Event, err error) {
	v := egress.Verdict{Reason: egress.ReasonHostMismatch}
	var ref *sniff.Refusal
	http := false
	if errors.As(err, &ref) {
		v, http = ref.Verdict, ref.HTTP
	}
	if v.Host != "" {
		ev.Host = v.Host
	}
	ev.Reason = v.Reason
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	s.refuse(ev)
	if !http {
		ep.Abort()
		return
	}
	sniff.WriteForbidden(guest, v.Reason)
	closeAfterRefusal(guest)
}

// refusalDrain bounds how long a refused connection's unread bytes are read
// and dropped after the answer, so that closing it does not reset the
// answer away.
const refusalDrain = 500 * time.Millisecond

// closeAfterRefusal ends the write side, drops what the client still sends
// for a moment, and closes.
func closeAfterRefusal(c *gonet.TCPConn) {
	c.CloseWrite()
	c.SetReadDeadline(time.Now().Add(refusalDrain))
	io.Copy(io.Discard, io.LimitReader(c, 1<<20))
	c.Close()
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
// records the flow. With a guard, what the guest sends is read through it,
// and a request it refuses is recorded on its own and ends the connection.
func (s *Stack) splice(f *flowState, ev flightrec.Event, guest *gonet.TCPConn, ep tcpip.Endpoint, host *net.TCPConn, guard *sniff.Guard) {
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
	var fromGuest, fromHost io.Reader = guest, host
	if guard != nil {
		fromGuest, fromHost = guard, guard.Downstream(host)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	var refused atomic.Bool
	var grace *time.Timer
	go func() {
		defer wg.Done()
		err := s.copyCount(host, fromGuest, &up, &s.bytesUp)
		var ref *sniff.Refusal
		switch {
		case errors.As(err, &ref):
			// The requests before it were allowed: let the server answer
			// them, then end the connection.
			s.refuseLater(ev, ref.Verdict)
			refused.Store(true)
			grace = time.AfterFunc(refusalGrace, abort)
			host.CloseWrite()
		case err != nil:
			fail(err)
		default:
			host.CloseWrite()
		}
	}()
	go func() {
		defer wg.Done()
		if err := s.copyCount(guest, fromHost, &down, &s.bytesDn); err != nil {
			fail(err)
			return
		}
		guest.CloseWrite()
	}()
	wg.Wait()
	if grace != nil {
		grace.Stop()
	}
	guest.Close()
	host.Close()

	ev.Allowed = true
	ev.BytesUp, ev.BytesDown = up.Load(), down.Load()
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	if e, ok := firstErr.Load().(string); ok && s.ctx.Err() == nil {
		ev.Error = e
	} else if refused.Load() {
		ev.Error = errRefusedLater.Error()
	}
	s.emit(ev)
}

// refusalGrace bounds how long the server may take to answer the requests
// before a refused one, once the client's side has been ended for it.
const refusalGrace = 5 * time.Second

// errRefusedLater is the allowed flow's error when a later request on it
// was refused.
var errRefusedLater = errors.New("a later request on the connection was refused")

// refuseLater records a request refused after the connection's first: its
// own record, beside the connection's.
func (s *Stack) refuseLater(ev flightrec.Event, v egress.Verdict) {
	ev.Time = time.Now()
	ev.Reason = v.Reason
	if v.Host != "" {
		ev.Host = v.Host
	}
	ev.BytesUp, ev.BytesDown, ev.Error = 0, 0, ""
	s.refuse(ev)
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
