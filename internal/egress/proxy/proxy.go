// Package proxy is the proxy-aware path of filtered egress: an HTTP proxy
// (CONNECT and absolute-form http:// requests) and a SOCKS5 proxy
// (CONNECT, with names or addresses) that the guest reaches on its
// gateway. Both judge every request with the run's [egress.Filter], dial
// the addresses the filter resolved (never one the guest chose), check the
// names the tunnelled bytes carry, and record each request as one
// [flightrec.Event].
package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/errdefs"
)

// Proxy limits.
const (
	DefaultDialTimeout = 10 * time.Second
	requestTimeout     = 30 * time.Second // a proxy request's head
	headTimeout        = 10 * time.Second // the first request inside a tunnel to port 80/443
	refusalGrace       = 5 * time.Second  // for the server to answer what came before a refused request
	refusalDrain       = 500 * time.Millisecond
	maxConns           = 256
)

// Config configures a [Server].
type Config struct {
	Filter   *egress.Filter
	Recorder flightrec.Recorder // one event per request; nil: none
	// Dial connects to an allowed destination. The proxy never opens a
	// socket itself; the caller decides how (and from where) to dial.
	Dial        func(ctx context.Context, network, address string) (net.Conn, error)
	DialTimeout time.Duration // 0: DefaultDialTimeout
	Logger      *slog.Logger
	// Credential, when set, is the VM's credential endpoint: an
	// absolute-form http:// request for CredentialAddr (the gateway's
	// address and the endpoint's port) is handed to it, method, target and
	// body kept, and not judged as egress (credential.go).
	Credential     http.Handler
	CredentialAddr netip.AddrPort
}

// Validate checks c.
func (c *Config) Validate() error {
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

// Server is the proxy-aware path of filtered egress: an HTTP proxy (CONNECT
// and absolute-form http:// requests) and a SOCKS5 proxy (CONNECT, with
// names or addresses), both judged by the same [egress.Filter] as direct
// traffic. Names are resolved by the Filter and the proxy dials the name's
// address, never one the guest chose. Every name a request carries must be
// the one it asks for, and so must every name the tunnelled bytes carry
// (the TLS SNI, the Host and target of each HTTP request); on ports 80 and
// 443 the first request or ClientHello is checked before anything is
// dialled.
type Server struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	sem    chan struct{}

	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

// New builds a Server; serve it with ServeHTTPProxy and ServeSOCKS.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.DialTimeout == 0 {
		cfg.DialTimeout = DefaultDialTimeout
	}
	p := &Server{cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, maxConns), conns: make(map[net.Conn]struct{})}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

// ServeHTTPProxy serves the HTTP proxy on l until l is closed or Close.
func (p *Server) ServeHTTPProxy(l net.Listener) error { return p.serve(l, p.handleHTTP) }

// ServeSOCKS serves the SOCKS5 proxy on l until l is closed or Close.
func (p *Server) ServeSOCKS(l net.Listener) error { return p.serve(l, p.handleSOCKS) }

func (p *Server) serve(l net.Listener, handle func(net.Conn)) error {
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
			defer closeGently(c)
			handle(c)
		}()
	}
}

func (p *Server) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ctx.Err() != nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Server) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// Close ends every connection and waits for the handlers. Idempotent.
func (p *Server) Close() {
	p.mu.Lock()
	p.cancel()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Server) record(ev flightrec.Event) {
	if p.cfg.Recorder != nil {
		p.cfg.Recorder.Record(ev)
	}
}

// recordDone records a flow that has ended, stamping its duration.
func (p *Server) recordDone(ev flightrec.Event) {
	ev.DurationMS = time.Since(ev.Time).Milliseconds()
	p.record(ev)
}

// judge decides a request for host:port. ev is filled for the record;
// ev.Allowed with a dial_failed reason means the name could not be
// resolved.
func (p *Server) judge(proto, host string, port uint16) (egress.Target, flightrec.Event) {
	ev := flightrec.Event{Time: time.Now(), Proto: proto, Port: port}
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	t, v, err := p.cfg.Filter.Judge(ctx, host, port)
	ev.Host, ev.Reason, ev.Allowed = t.Host, v.Reason, v.Allow
	if t.Dial.IsValid() {
		ev.Dst = t.Dial.Addr()
	} else if a, perr := netip.ParseAddr(t.Host); perr == nil {
		ev.Dst = a
	}
	if err != nil {
		ev.Allowed, ev.Reason, ev.Error = true, egress.ReasonDialFailed, err.Error()
	}
	return t, ev
}

// dial connects to an allowed target; on failure ev says dial_failed.
func (p *Server) dial(t egress.Target, ev *flightrec.Event) net.Conn {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.DialTimeout)
	defer cancel()
	c, err := p.cfg.Dial(ctx, "tcp", t.Dial.String())
	if err != nil {
		ev.Reason, ev.Error = egress.ReasonDialFailed, err.Error()
		return nil
	}
	return c
}

// open judges host:port and dials it: a nil conn with ev.Allowed false is
// a refusal, with ev.Allowed true a failure.
func (p *Server) open(proto, host string, port uint16) (net.Conn, egress.Target, flightrec.Event) {
	t, ev := p.judge(proto, host, port)
	if !ev.Allowed || ev.Reason == egress.ReasonDialFailed {
		return nil, t, ev
	}
	return p.dial(t, &ev), t, ev
}
