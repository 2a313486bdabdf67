package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/sniff"
)

// answer is what a tunnel request is told.
type answer int

const (
	answerOK      answer = iota // the tunnel is open
	answerRefused               // the policy refused it
	answerFailed                // allowed, but the destination could not be reached
)

// tunnel serves a tunnel request for host:port (CONNECT or SOCKS5, told
// its answer through reply). A tunnel to a name carries the client's bytes
// through a sniff.Guard, which requires every name they carry to be that
// name. On ports 80 and 443, where the client speaks first, the tunnel is
// opened to the client first and the destination dialled only once the
// first request (or ClientHello) has passed, so that a refused one never
// reaches the server; elsewhere the destination is dialled first.
func (p *Server) tunnel(c net.Conn, br *bufio.Reader, proto, host string, port uint16, reply func(answer, flightrec.Event) error) {
	t, ev := p.judge(proto, host, port)
	if !ev.Allowed || ev.Reason == egress.ReasonDialFailed {
		a := answerRefused
		if ev.Allowed {
			a = answerFailed // the name could not be resolved
		}
		p.recordDone(ev)
		reply(a, ev)
		return
	}
	var guard *sniff.Guard
	clientFirst := len(t.Names) > 0 && egress.SniffPort(port)
	if len(t.Names) > 0 {
		guard = sniff.NewGuard(br, sniff.Config{Strict: clientFirst, Judge: func(raw, from string) egress.Verdict {
			return egress.MatchName(raw, from, t.Names)
		}})
	}
	var up net.Conn
	if !clientFirst {
		if up = p.dial(t, &ev); up == nil {
			reply(answerFailed, ev)
			p.recordDone(ev)
			return
		}
		defer up.Close()
	}
	if err := reply(answerOK, ev); err != nil {
		return
	}
	if clientFirst {
		if !p.checkFirst(c, guard, &ev) {
			p.recordDone(ev)
			return
		}
		if up = p.dial(t, &ev); up == nil {
			resetConn(c)
			p.recordDone(ev)
			return
		}
		defer up.Close()
	}
	var from io.Reader = br
	if guard != nil {
		from = guard
	}
	p.splice(c, from, up, guard, &ev)
	p.recordDone(ev)
}

// checkFirst reads the client's first request (or ClientHello) into the
// open tunnel and judges it; a refusal is answered (403 for HTTP, else a
// reset) and ev made its record.
func (p *Server) checkFirst(c net.Conn, g *sniff.Guard, ev *flightrec.Event) bool {
	c.SetReadDeadline(time.Now().Add(headTimeout))
	v, err := g.First()
	c.SetReadDeadline(time.Time{})
	if err == nil {
		if v.Host != "" {
			ev.Host = v.Host
		}
		return true
	}
	ev.Allowed, ev.Reason = false, egress.ReasonHostMismatch
	var ref *sniff.Refusal
	if errors.As(err, &ref) {
		ev.Reason = ref.Verdict.Reason
		if ref.Verdict.Host != "" {
			ev.Host = ref.Verdict.Host
		}
		if ref.HTTP {
			sniff.WriteForbidden(c, ev.Reason)
			return false
		}
	}
	resetConn(c)
	return false
}

// splice copies both ways until both end, counting bytes into ev. A
// request the guard refuses mid-stream is recorded on its own; the server
// may still answer what came before it, then the tunnel ends.
func (p *Server) splice(c net.Conn, fromClient io.Reader, up net.Conn, guard *sniff.Guard, ev *flightrec.Event) {
	var fromUp io.Reader = up
	if guard != nil {
		fromUp = guard.Downstream(up)
	}
	var upN, downN int64
	var grace *time.Timer
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		var err error
		upN, err = io.Copy(up, fromClient)
		var ref *sniff.Refusal
		if errors.As(err, &ref) {
			p.refuseLater(*ev, ref.Verdict)
			ev.Error = "a later request in the tunnel was refused"
			grace = time.AfterFunc(refusalGrace, func() {
				resetConn(c)
				up.Close()
			})
		}
		closeWrite(up)
	}()
	go func() {
		defer wg.Done()
		downN, _ = io.Copy(c, fromUp)
		closeWrite(c)
	}()
	wg.Wait()
	if grace != nil {
		grace.Stop()
	}
	ev.BytesUp += upN
	ev.BytesDown += downN
}

// refuseLater records a request refused inside a tunnel after its first.
func (p *Server) refuseLater(ev flightrec.Event, v egress.Verdict) {
	ev.Time, ev.Allowed, ev.Reason = time.Now(), false, v.Reason
	if v.Host != "" {
		ev.Host = v.Host
	}
	ev.BytesUp, ev.BytesDown, ev.Error = 0, 0, ""
	p.record(ev)
}

// closeWrite ends c's write side (or closes it when it has none).
func closeWrite(c net.Conn) {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
		return
	}
	c.Close()
}

// resetConn closes c with a reset where it can (a refused tunnel fails at
// once, it does not look like a server that hung up).
func resetConn(c net.Conn) {
	if l, ok := c.(interface{ SetLinger(int) error }); ok {
		l.SetLinger(0)
	}
	c.Close()
}

// closeGently ends c after its handler: the write side first, then what the
// client still sends is read and dropped for a moment, so that closing does
// not reset an answer away.
func closeGently(c net.Conn) {
	closeWrite(c)
	c.SetReadDeadline(time.Now().Add(refusalDrain))
	io.Copy(io.Discard, io.LimitReader(c, 1<<20))
	c.Close()
}
