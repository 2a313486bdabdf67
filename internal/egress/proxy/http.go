package proxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/sniff"
)

// handleHTTP serves one client connection of the HTTP proxy: one request.
// CONNECT opens a tunnel; an absolute-form http:// request is forwarded
// with Connection: close. Either must name one host: a Host field that
// names another is refused.
func (p *Server) handleHTTP(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	head, raw, err := sniff.ReadHead(br)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		if len(raw) == 0 && errors.Is(err, io.EOF) {
			return // the client sent nothing
		}
		reason := egress.ReasonBadRequest
		if errors.Is(err, sniff.ErrMalformed) {
			reason = egress.ReasonMalformed
		}
		p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Host: egress.MalformedHost, Reason: reason})
		httpError(c, http.StatusBadRequest, "malformed proxy request")
		return
	}
	ev := flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Host: egress.RecordHost(head.Authority)}
	if head.Method == http.MethodConnect {
		p.httpConnect(c, br, head, ev)
		return
	}
	port, ok := parsePort(head.AuthorityPort, 80)
	switch {
	case head.Scheme == "https":
		ev.Port, ev.Reason = 443, egress.ReasonBadRequest
		p.record(ev)
		httpError(c, http.StatusNotImplemented, "this proxy does not fetch https:// URLs for you; use CONNECT (an https_proxy setting makes clients do that)")
		return
	case head.Scheme != "http" || !ok:
		p.badRequest(c, ev, "want an absolute http:// URL with a port in 1-65535, or CONNECT host:port")
		return
	}
	ev.Port = port
	if stray, bad := strayHost(head.Authority, head.Hosts); bad {
		p.refuseStray(c, ev, stray)
		return
	}
	if p.isCredential(head, port) {
		p.serveCredential(c, br, raw)
		return
	}
	p.forward(c, br, head, raw, port)
}

// badRequest records a request the proxy cannot parse as what it serves
// and answers 400 with msg.
func (p *Server) badRequest(c net.Conn, ev flightrec.Event, msg string) {
	ev.Reason = egress.ReasonBadRequest
	if ev.Host == "" {
		ev.Host = egress.MalformedHost
	}
	p.record(ev)
	httpError(c, http.StatusBadRequest, msg)
}

// forward sends an absolute-form request to the host it names and copies
// the answer back.
func (p *Server) forward(c net.Conn, br *bufio.Reader, head *sniff.Head, raw []byte, port uint16) {
	up, _, ev := p.open(egress.ProtoHTTPProxy, head.Authority, port)
	if up == nil {
		// Recorded before the answer: what the guest sees is on record.
		p.recordDone(ev)
		refuseHTTP(c, ev)
		return
	}
	defer up.Close()
	req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(raw), br)))
	if err != nil {
		ev.Allowed, ev.Reason, ev.Error = false, egress.ReasonMalformed, err.Error()
		p.recordDone(ev)
		httpError(c, http.StatusBadRequest, "malformed proxy request")
		return
	}
	// The origin is told the name that was judged (RFC 9112 3.2.2: an
	// absolute-form target overrides Host).
	req.Host = req.URL.Host
	req.URL.Scheme, req.URL.Host = "", ""
	req.RequestURI = ""
	for _, h := range []string{"Proxy-Connection", "Proxy-Authorization", "Connection", "Keep-Alive"} {
		req.Header.Del(h)
	}
	req.Close = true
	cw := &countWriter{w: up}
	if err := req.Write(cw); err != nil {
		ev.Error = err.Error()
	}
	ev.BytesUp = cw.n
	n, _ := io.Copy(c, up)
	ev.BytesDown = n
	p.recordDone(ev)
}

// httpConnect opens a CONNECT tunnel.
func (p *Server) httpConnect(c net.Conn, br *bufio.Reader, head *sniff.Head, ev flightrec.Event) {
	port, ok := parsePort(head.AuthorityPort, 0)
	if !ok || head.Authority == "" {
		p.badRequest(c, ev, "CONNECT wants host:port with a port in 1-65535")
		return
	}
	ev.Port = port
	if stray, bad := strayHost(head.Authority, head.Hosts); bad {
		p.refuseStray(c, ev, stray)
		return
	}
	p.tunnel(c, br, egress.ProtoHTTPProxy, head.Authority, port, func(a answer, ev flightrec.Event) error {
		switch a {
		case answerOK:
			_, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n")
			return err
		default:
			refuseHTTP(c, ev)
			return nil
		}
	})
}

// parsePort reads a port ("" gives def; 0 and out of range are not ports).
func parsePort(s string, def uint16) (uint16, bool) {
	if s == "" {
		return def, def != 0
	}
	n, err := strconv.ParseUint(s, 10, 16)
	return uint16(n), err == nil && n != 0
}

// strayHost returns the first Host (as recorded) that does not name the
// target, and whether there is one.
func strayHost(target string, hosts []string) (string, bool) {
	want := egress.RecordHost(target)
	for _, h := range hosts {
		if r := egress.RecordHost(h); r != want {
			if r == "" {
				r = egress.InvalidHost(0)
			}
			return r, true
		}
	}
	return "", false
}

// refuseStray refuses a request whose Host names another host than its
// target.
func (p *Server) refuseStray(c net.Conn, ev flightrec.Event, stray string) {
	ev.Host, ev.Reason = stray, egress.ReasonHostMismatch
	p.record(ev)
	sniff.WriteForbidden(c, ev.Reason)
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// refuseHTTP answers a refused or failed proxy request.
func refuseHTTP(c net.Conn, ev flightrec.Event) {
	if ev.Allowed {
		httpError(c, http.StatusBadGateway, fmt.Sprintf("isopod egress: %s:%d could not be reached (%s)", ev.Host, ev.Port, ev.Reason))
		return
	}
	msg := fmt.Sprintf("isopod egress: %s:%d refused (%s)", ev.Host, ev.Port, ev.Reason)
	if ev.Reason == egress.ReasonNotAllowed {
		msg += "; allow it with --allow-host " + ev.Host
	}
	httpError(c, http.StatusForbidden, msg)
}

func httpError(c net.Conn, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}
