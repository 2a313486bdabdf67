package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"

	"isopod/internal/errdefs"
)

// Proxy limits.
const (
	DefaultProxyDialTimeout = 10 * time.Second
	proxyHeaderTimeout      = 30 * time.Second
	proxyHeadTimeout        = 10 * time.Second // first bytes inside a tunnel to port 80/443
	maxProxyConns           = 256
)

// ProxyConfig configures a [Proxy].
type ProxyConfig struct {
	Filter   *Filter
	Recorder Recorder // one event per request; nil: none
	// Dial connects to an allowed destination. The proxy never opens a
	// socket itself; the caller decides how (and from where) to dial.
	Dial        func(ctx context.Context, network, address string) (net.Conn, error)
	DialTimeout time.Duration // 0: DefaultProxyDialTimeout
	Logger      *slog.Logger
}

// Validate checks c.
func (c *ProxyConfig) Validate() error {
	switch {
	case c.Filter == nil:
		return fmt.Errorf("egress proxy: no filter: %w", errdefs.ErrInvalidArgument)
	case c.Dial == nil:
		return fmt.Errorf("egress proxy: no dial function: %w", errdefs.ErrInvalidArgument)
	case c.DialTimeout < 0:
		return fmt.Errorf("egress proxy: negative dial timeout: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}

// Proxy is the proxy-aware path of filtered egress: an HTTP proxy (CONNECT
// and absolute-form http:// requests) and a SOCKS5 proxy (CONNECT, with
// names or addresses), both judged by the same [Filter] as direct traffic.
// Names are resolved by the Filter and the proxy dials the name's address,
// never one the guest chose; a tunnel to port 80 or 443 must carry the
// requested name in its TLS SNI or HTTP Host.
type Proxy struct {
	cfg    ProxyConfig
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// NewProxy builds a Proxy; serve it with ServeHTTP and ServeSOCKS.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultProxyDialTimeout
	}
	p := &Proxy{cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, maxProxyConns), conns: make(map[net.Conn]struct{})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// ServeHTTP serves the HTTP proxy on l until l is closed or Close.
func (p *Proxy) ServeHTTP(l net.Listener) error { return p.serve(l, p.handleHTTP) }

// ServeSOCKS serves the SOCKS5 proxy on l until l is closed or Close.
func (p *Proxy) ServeSOCKS(l net.Listener) error { return p.serve(l, p.handleSOCKS) }

func (p *Proxy) serve(l net.Listener, handle func(net.Conn)) error {
	p.wg.Add(1)
	defer p.wg.Done()
	stop := context.AfterFunc(p.ctx, func() { l.Close() })
	defer stop()
	for {
		c, err := l.Accept()
		if err != nil {
			if p.ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("egress proxy accept: %w", err)
		}
		select {
		case p.sem <- struct{}{}:
		default:
			c.Close()
			continue
		}
		if !p.track(c) {
			<-p.sem
			c.Close()
			return nil
		}
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer func() { <-p.sem }()
			defer p.untrack(c)
			defer c.Close()
			handle(c)
		}()
	}
}

func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Close ends every connection and waits for the handlers. Idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.cancel()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) record(ev Event) {
	if p.cfg.Recorder != nil {
		p.cfg.Recorder.Record(ev)
	}
}

// recordDone records a flow that has ended, stamping its duration.
func (p *Proxy) recordDone(ev Event) {
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	p.record(ev)
}

// open judges host:port and dials it. ev is filled for the record; a nil
// conn with ev.Allowed false is a refusal, with ev.Allowed true a failure.
func (p *Proxy) open(proto, host string, port uint16) (net.Conn, Target, Event) {
	ev := Event{Time: time.Now(), Proto: proto, Port: port}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	t, v, err := p.cfg.Filter.Judge(ctx, host, port)
	ev.Host, ev.Reason = t.Host, v.Reason
	if t.Dial.IsValid() {
		ev.Dst = t.Dial.Addr()
	} else if a, perr := netip.ParseAddr(t.Host); perr == nil {
		ev.Dst = a
	}
	if err != nil {
		ev.Allowed, ev.Reason, ev.Error = true, ReasonDialFailed, err.Error()
		return nil, t, ev
	}
	if !v.Allow {
		return nil, t, ev
	}
	ev.Allowed = true
	c, err := p.cfg.Dial(ctx, "tcp", t.Dial.String())
	if err != nil {
		ev.Reason, ev.Error = ReasonDialFailed, err.Error()
		return nil, t, ev
	}
	return c, t, ev
}

// checkHead reads the first bytes a client sends into a tunnel to port 80
// or 443 and checks that they name the tunnel's host. It returns what it
// read (to forward) and whether the tunnel may go on; ev is updated.
func (p *Proxy) checkHead(c net.Conn, br *bufio.Reader, t Target, port uint16, ev *Event) ([]byte, bool) {
	if !sniffPort(port) || len(t.Names) == 0 {
		return nil, true
	}
	c.SetReadDeadline(time.Now().Add(proxyHeadTimeout))
	defer c.SetReadDeadline(time.Time{})
	var head []byte
	buf := make([]byte, 4096)
	for {
		n, err := br.Read(buf)
		head = append(head, buf[:n]...)
		v, more := p.cfg.Filter.matchHead(head, t.Names, t.Dial)
		if !more || err != nil || len(head) >= maxClientHello {
			if !v.Allow {
				ev.Allowed, ev.Reason = false, v.Reason
				if v.Host != "" {
					ev.Host = v.Host
				}
				if n == 0 && err != nil && len(head) == 0 {
					// The client sent nothing at all: nothing to judge.
					ev.Allowed, ev.Reason = true, ReasonAllowedHost
				}
			}
			return head, v.Allow
		}
	}
}

// splice copies both ways until both end, counting bytes into ev.
func splice(client net.Conn, clientR io.Reader, up net.Conn, ev *Event) {
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

// handleHTTP serves one client connection of the HTTP proxy: one request
// (CONNECT opens a tunnel; an absolute-form http:// request is forwarded
// with Connection: close).
func (p *Proxy) handleHTTP(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(proxyHeaderTimeout))
	req, err := http.ReadRequest(br)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) {
			httpError(c, http.StatusBadRequest, "malformed proxy request")
			p.record(Event{Time: time.Now(), Proto: ProtoHTTPProxy, Reason: ReasonBadRequest})
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
		p.record(Event{Time: time.Now(), Proto: ProtoHTTPProxy, Host: req.URL.Hostname(), Port: 443, Reason: ReasonBadRequest})
		return
	case req.URL.Scheme != "http" || req.URL.Host == "":
		httpError(c, http.StatusBadRequest, "want an absolute http:// URL or CONNECT host:port")
		p.record(Event{Time: time.Now(), Proto: ProtoHTTPProxy, Reason: ReasonBadRequest})
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
	up, _, ev := p.open(ProtoHTTPProxy, host, port)
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

func (p *Proxy) httpConnect(c net.Conn, br *bufio.Reader, req *http.Request) {
	host, portS, err := net.SplitHostPort(req.RequestURI)
	port, perr := strconv.ParseUint(portS, 10, 16)
	if err != nil || perr != nil || port == 0 {
		httpError(c, http.StatusBadRequest, "CONNECT wants host:port")
		p.record(Event{Time: time.Now(), Proto: ProtoHTTPProxy, Host: RecordHost(req.RequestURI), Reason: ReasonBadRequest})
		return
	}
	up, t, ev := p.open(ProtoHTTPProxy, host, uint16(port))
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
func (p *Proxy) tunnel(c net.Conn, br *bufio.Reader, up net.Conn, t Target, port uint16, ev Event) {
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
func refuseHTTP(c net.Conn, ev Event) {
	if ev.Allowed {
		httpError(c, http.StatusBadGateway, fmt.Sprintf("isopod egress: %s:%d could not be reached (%s)", ev.Host, ev.Port, ev.Reason))
		return
	}
	msg := fmt.Sprintf("isopod egress: %s:%d refused (%s)", ev.Host, ev.Port, ev.Reason)
	if ev.Reason == ReasonNotAllowed {
		msg += "; allow it with --allow-host " + ev.Host
	}
	httpError(c, http.StatusForbidden, msg)
}

func httpError(c net.Conn, code int, msg string) {
	body := msg + "\n"
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		code, http.StatusText(code), len(body), body)
}

// SOCKS5 wire values (RFC 1928).
const (
	socksVersion    = 5
	socksNoAuth     = 0
	socksNoMethod   = 0xff
	socksConnect    = 1
	socksAtypV4     = 1
	socksAtypDomain = 3
	socksAtypV6     = 4

	socksOK             = 0
	socksFailure        = 1
	socksNotAllowed     = 2
	socksHostUnreach    = 4
	socksCmdUnsupported = 7
	socksAtypUnsupp     = 8
)

// SOCKSRequest is a parsed SOCKS5 CONNECT request.
type SOCKSRequest struct {
	Cmd  byte
	Host string // a name as sent, or an address's text
	Port uint16
}

// ReadSOCKSRequest reads a SOCKS5 greeting and request from r and writes
// the method choice to w. A request other than CONNECT is returned with its
// Cmd for the caller to refuse.
func ReadSOCKSRequest(r io.Reader, w io.Writer) (SOCKSRequest, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return SOCKSRequest{}, err
	}
	if hdr[0] != socksVersion {
		return SOCKSRequest{}, fmt.Errorf("socks: version %d, want 5", hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return SOCKSRequest{}, err
	}
	hasNoAuth := false
	for _, m := range methods {
		hasNoAuth = hasNoAuth || m == socksNoAuth
	}
	if !hasNoAuth {
		w.Write([]byte{socksVersion, socksNoMethod})
		return SOCKSRequest{}, fmt.Errorf("socks: client offers no unauthenticated method")
	}
	if _, err := w.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return SOCKSRequest{}, err
	}
	var req [4]byte
	if _, err := io.ReadFull(r, req[:]); err != nil {
		return SOCKSRequest{}, err
	}
	if req[0] != socksVersion {
		return SOCKSRequest{}, fmt.Errorf("socks: request version %d, want 5", req[0])
	}
	out := SOCKSRequest{Cmd: req[1]}
	switch req[3] {
	case socksAtypV4:
		var a [4]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return out, err
		}
		out.Host = netip.AddrFrom4(a).String()
	case socksAtypV6:
		var a [16]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return out, err
		}
		out.Host = netip.AddrFrom16(a).String()
	case socksAtypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return out, err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(r, name); err != nil {
			return out, err
		}
		out.Host = string(name)
	default:
		return out, errSOCKSAtyp
	}
	var port [2]byte
	if _, err := io.ReadFull(r, port[:]); err != nil {
		return out, err
	}
	out.Port = uint16(port[0])<<8 | uint16(port[1])
	return out, nil
}

var errSOCKSAtyp = errors.New("socks: unknown address type")

func socksReply(w io.Writer, code byte) error {
	_, err := w.Write([]byte{socksVersion, code, 0, socksAtypV4, 0, 0, 0, 0, 0, 0})
	return err
}

func (p *Proxy) handleSOCKS(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(proxyHeaderTimeout))
	req, err := ReadSOCKSRequest(br, c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		if errors.Is(err, errSOCKSAtyp) {
			socksReply(c, socksAtypUnsupp)
		}
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			p.record(Event{Time: time.Now(), Proto: ProtoSOCKS, Reason: ReasonBadRequest, Error: err.Error()})
		}
		return
	}
	if req.Cmd != socksConnect {
		socksReply(c, socksCmdUnsupported)
		reason := ReasonBadRequest
		if req.Cmd == 3 { // UDP ASSOCIATE
			reason = ReasonNonTCP
		}
		p.record(Event{Time: time.Now(), Proto: ProtoSOCKS, Host: RecordHost(req.Host), Port: req.Port, Reason: reason})
		return
	}
	up, t, ev := p.open(ProtoSOCKS, req.Host, req.Port)
	if up == nil {
		code := byte(socksNotAllowed)
		if ev.Allowed {
			code = socksHostUnreach
		}
		socksReply(c, code)
		p.recordDone(ev)
		return
	}
	defer up.Close()
	if err := socksReply(c, socksOK); err != nil {
		return
	}
	p.tunnel(c, br, up, t, req.Port, ev)
}
