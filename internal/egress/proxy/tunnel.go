package proxy

import (
	"bufio"
	"io"
	"net"
	"sync"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/sniff"
)

// checkHead reads the first bytes a client sends into a tunnel to port 80
// or 443 and checks that they name the tunnel's host. It returns what it
// read (to forward) and whether the tunnel may go on; ev is updated.
func (p *Server) checkHead(c net.Conn, br *bufio.Reader, t egress.Target, port uint16, ev *flightrec.Event) ([]byte, bool) {
	if !egress.SniffPort(port) || len(t.Names) == 0 {
		return nil, true
	}
	c.SetReadDeadline(time.Now().Add(headTimeout))
	defer c.SetReadDeadline(time.Time{})
	var head []byte
	buf := make([]byte, 4096)
	for {
		n, err := br.Read(buf)
		head = append(head, buf[:n]...)
		name, from, perr := sniff.HeadName(head)
		more := sniff.NeedMore(perr)
		if perr != nil {
			name = ""
		}
		if !more || err != nil || len(head) >= headCap {
			v := egress.MatchName(name, from, t.Names)
			if !v.Allow {
				ev.Allowed, ev.Reason = false, v.Reason
				if v.Host != "" {
					ev.Host = v.Host
				}
				if n == 0 && err != nil && len(head) == 0 {
					// The client sent nothing at all: nothing to judge.
					ev.Allowed, ev.Reason = true, egress.ReasonAllowedHost
				}
			}
			return head, v.Allow
		}
	}
}

// splice copies both ways until both end, counting bytes into ev.
func splice(client net.Conn, clientR io.Reader, up net.Conn, ev *flightrec.Event) {
	var upN, downN int64
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); upN = copyHalf(up, clientR) }()
	go func() { defer wg.Done(); downN = copyHalf(client, up) }()
	wg.Wait()
	ev.BytesUp += upN
	ev.BytesDown += downN
}

// copyHalf copies src to dst until src ends, then ends dst's write side (or
// closes dst when it has none), and returns the bytes copied.
func copyHalf(dst net.Conn, src io.Reader) int64 {
	n, _ := io.Copy(dst, src)
	if tc, ok := dst.(interface{ CloseWrite() error }); ok {
		tc.CloseWrite()
	} else {
		dst.Close()
	}
	return n
}
