package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// handleHTTP serves one client connection of the HTTP proxy: one request
// (CONNECT opens a tunnel; an absolute-form http:// request is forwarded
// with Connection: close).
func (p *Server) handleHTTP(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := http.ReadRequest(br)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) {
			httpError(c, http.StatusBadRequest, "malformed proxy request")
			p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Reason: egress.ReasonBadRequest})
		}
		return
	}
	if req.Method == http.MethodConnect {
		p.httpConnect(c, br, req)
		return
	}
	switch {
	case req.URL.Scheme == "https":
		httpError(c, http.StatusNotImplemented, "this proxy does not fetch https:// URLs for you; use CONNECT (an https_proxy setting makes clients do that)")
		p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Host: req.URL.Hostname(), Port: 443, Reason: egress.ReasonBadRequest})
		return
	case req.URL.Scheme != "http" || req.URL.Host == "":
		httpError(c, http.StatusBadRequest, "want an absolute http:// URL or CONNECT host:port")
		p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Reason: egress.ReasonBadRequest})
		return
	}
	port := uint16(80)
	if s := req.URL.Port(); s != "" {
		n, err := strconv.ParseUint(s, 10, 16)
		if err != nil || n == 0 {
			httpError(c, http.StatusBadRequest, "bad port in URL")
			return
		}
		port = uint16(n)
	}
	host := req.URL.Hostname()
	up, _, ev := p.open(egress.ProtoHTTPProxy, host, port)
	if up == nil {
		refuseHTTP(c, ev)
		p.recordDone(ev)
		return
	}
	defer up.Close()
	// An absolute-form target overrides any Host header (RFC 9112 3.2.2):
	// the origin is told the name that was judged.
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

func (p *Server) httpConnect(c net.Conn, br *bufio.Reader, req *http.Request) {
	host, portS, err := net.SplitHostPort(req.RequestURI)
	port, perr := strconv.ParseUint(portS, 10, 16)
	if err != nil || perr != nil || port == 0 {
		httpError(c, http.StatusBadRequest, "CONNECT wants host:port")
		p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoHTTPProxy, Host: egress.RecordHost(req.RequestURI), Reason: egress.ReasonBadRequest})
		return
	}
	up, t, ev := p.open(egress.ProtoHTTPProxy, host, uint16(port))
	if up == nil {
		refuseHTTP(c, ev)
		p.recordDone(ev)
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	p.tunnel(c, br, up, t, uint16(port), ev)
}

// tunnel checks the first bytes (ports 80/443), then splices.
func (p *Server) tunnel(c net.Conn, br *bufio.Reader, up net.Conn, t egress.Target, port uint16, ev flightrec.Event) {
	head, ok := p.checkHead(c, br, t, port, &ev)
	if !ok {
		if tc, isTCP := c.(interface{ SetLinger(int) error }); isTCP {
			tc.SetLinger(0)
		}
		p.recordDone(ev)
		return
	}
	if len(head) > 0 {
		n, err := up.Write(head)
		ev.BytesUp += int64(n)
		if err != nil {
			ev.Error = err.Error()
			p.record(ev)
			return
		}
	}
	splice(c, br, up, &ev)
	p.recordDone(ev)
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
