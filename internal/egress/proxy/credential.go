package proxy

import (
	"bufio"
	"bytes"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"

	"isopod/internal/egress/sniff"
)

// The credential endpoint through the HTTP proxy. Clients that ignore
// NO_PROXY (busybox wget) send their request for the endpoint to the
// proxy in absolute form; the proxy hands it, method, target and body
// kept, to the endpoint's handler instead of judging it as egress. The
// handler records the request itself.

// isCredential reports whether an absolute-form http:// request targets
// the credential endpoint.
func (p *Server) isCredential(head *sniff.Head, port uint16) bool {
	if p.cfg.Credential == nil || !p.cfg.CredentialAddr.IsValid() {
		return false
	}
	a, err := netip.ParseAddr(head.Authority)
	return err == nil && a.Unmap() == p.cfg.CredentialAddr.Addr() && port == p.cfg.CredentialAddr.Port()
}

// serveCredential serves the one request on c (its head already read into
// raw, the rest in br) with the credential handler, and returns when the
// answer is written.
func (p *Server) serveCredential(c net.Conn, br *bufio.Reader, raw []byte) {
	conn := &readConn{Conn: c, r: io.MultiReader(bytes.NewReader(raw), br)}
	l := &oneConn{c: conn, done: make(chan struct{})}
	var once sync.Once
	finished := make(chan struct{})
	srv := &http.Server{
		Handler:           p.cfg.Credential,
		ReadHeaderTimeout: requestTimeout,
		ErrorLog:          slog.NewLogLogger(p.log.Handler(), slog.LevelDebug),
		ConnState: func(_ net.Conn, st http.ConnState) {
			if st == http.StateClosed || st == http.StateHijacked {
				once.Do(func() { close(finished) })
			}
		},
	}
	srv.SetKeepAlivesEnabled(false)
	go srv.Serve(l)
	select {
	case <-finished:
	case <-p.ctx.Done():
	}
	srv.Close()
}

// readConn is a connection whose reads come from r (the bytes already
// read from it, then the rest).
type readConn struct {
	net.Conn
	r io.Reader
}

func (c *readConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// oneConn is a listener that accepts one connection, then waits to be
// closed.
type oneConn struct {
	mu   sync.Mutex
	c    net.Conn
	done chan struct{}
	once sync.Once
}

func (l *oneConn) Accept() (net.Conn, error) {
	l.mu.Lock()
	c := l.c
	l.c = nil
	l.mu.Unlock()
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return &net.TCPAddr{} }
