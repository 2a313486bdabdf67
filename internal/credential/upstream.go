package credential

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"isopod/internal/errdefs"
)

// Upstream timeouts.
const (
	// DefaultHeadTimeout bounds the wait for a response's head once the
	// request is sent; bodies stream without a cap on time.
	DefaultHeadTimeout = 60 * time.Second
	// DefaultBodyIdleTimeout bounds the wait for each part of a request
	// body; a body that keeps arriving has no cap on time.
	DefaultBodyIdleTimeout = 60 * time.Second
	dialTimeout            = 30 * time.Second
	handshakeTimeout       = 30 * time.Second
)

// forwarded are the request headers passed on; every other one (Host,
// Authorization, Cookie included) is dropped. Content-Length travels as
// the request's length.
var forwarded = map[string]bool{
	"Accept": true, "Accept-Encoding": true, "Content-Type": true, "Content-Encoding": true,
	"Git-Protocol": true, "User-Agent": true,
}

// hopByHop are the response headers not relayed, with those a
// Connection header names.
var hopByHop = []string{"Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// userAgent is sent when the guest sends none.
const userAgent = "isopod-credential-endpoint"

// upstream is one alias's way to its host.
type upstream struct {
	cred Credential
	rt   *http.Transport
}

// newUpstream makes c's transport: TLS verified against the system's
// roots and c's CA file, no proxy, no redirect followed (the transport
// alone never follows one), dialled through cfg.Dial.
func newUpstream(c Credential, cfg GatewayConfig) (*upstream, error) {
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if ca := c.Alias.caPEM; ca != nil || c.Alias.CAFile != "" {
		if ca == nil {
			if ca, err = readCAFile(c.Alias.CAFile); err != nil {
				return nil, fmt.Errorf("ca_file: %w: %w", err, errdefs.ErrFailedPrecondition)
			}
		}
		if !roots.AppendCertsFromPEM(ca) {
			return nil, fmt.Errorf("ca_file %s holds no PEM certificate: %w", c.Alias.CAFile, errdefs.ErrFailedPrecondition)
		}
	}
	dial := cfg.Dial
	if dial == nil {
		dial = (&net.Dialer{}).DialContext
	}
	head := cfg.HeadTimeout
	if head <= 0 {
		head = DefaultHeadTimeout
	}
	rt := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			ctx, cancel := context.WithTimeout(ctx, dialTimeout)
			defer cancel()
			return dial(ctx, network, addr)
		},
		TLSClientConfig:       &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12},
		TLSHandshakeTimeout:   handshakeTimeout,
		ResponseHeaderTimeout: head,
		DisableCompression:    true,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
	}
	return &upstream{cred: c, rt: rt}, nil
}

// forward makes the request anew to the alias's host and relays the
// answer; target is the normalised path and the query.
func (g *Gateway) forward(w http.ResponseWriter, r *http.Request, up *upstream, target string, ev *Event) {
	if r.ContentLength > g.maxBody {
		g.refuse(w, ev, NoteBodyTooLarge)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	out, err := http.NewRequestWithContext(ctx, r.Method, "https://"+up.cred.Alias.Host+target, nil)
	if err != nil {
		g.refuse(w, ev, NoteBadPath)
		return
	}
	for k, vs := range r.Header {
		if forwarded[k] {
			out.Header[k] = append([]string(nil), vs...)
		}
	}
	if out.Header.Get("User-Agent") == "" {
		out.Header.Set("User-Agent", userAgent)
	}
	up.cred.secret.sign(out.Header, up.cred.Alias.Scheme, up.cred.Alias.User, up.cred.Alias.Header)
	body := &cappedBody{r: r.Body, left: g.maxBody, rc: http.NewResponseController(w), idle: g.bodyIdle, cancel: cancel}
	defer body.done()
	if r.ContentLength != 0 {
		out.Body, out.ContentLength = body, r.ContentLength
	}
	resp, err := up.rt.RoundTrip(out)
	ev.BytesUp = body.n.Load()
	if note := body.refusal(); note != "" {
		if resp != nil {
			resp.Body.Close()
		}
		cancel()
		g.refuse(w, ev, note)
		return
	}
	if err != nil {
		g.log.Warn("credential endpoint: upstream request failed", "alias", ev.Alias, "host", ev.Host, "err", err)
		var ne net.Error
		if errors.Is(err, context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			g.refuse(w, ev, NoteUpstreamTimeout)
		} else {
			g.refuse(w, ev, NoteUpstreamFailed)
		}
		return
	}
	defer resp.Body.Close()
	g.relay(w, resp, up, ev)
}

// relay sends resp's status, headers (less the hop-by-hop ones, and any
// that holds the secret: a host may echo the request's credential) and
// body, flushing as it goes. A body the host cuts is cut here too.
func (g *Gateway) relay(w http.ResponseWriter, resp *http.Response, up *upstream, ev *Event) {
	h := w.Header()
	a := up.cred.Alias
	for k, vs := range resp.Header {
		if slices.ContainsFunc(vs, func(v string) bool { return up.cred.secret.shownIn(v, a.Scheme, a.User) }) {
			g.log.Warn("credential endpoint: a response header that echoes the secret dropped", "alias", ev.Alias, "header", k)
			continue
		}
		h[k] = append([]string(nil), vs...)
	}
	for _, c := range resp.Header.Values("Connection") {
		for name := range strings.SplitSeq(c, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, k := range hopByHop {
		h.Del(k)
	}
	ev.Status = resp.StatusCode
	g.log.Debug("credential endpoint request", "alias", ev.Alias, "method", ev.Method, "path", ev.Path, "status", ev.Status)
	w.WriteHeader(resp.StatusCode)
	rc := http.NewResponseController(w)
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return // the guest went away
			}
			ev.Bytes += int64(n)
			_ = rc.Flush()
		}
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			ev.Note = NoteUpstreamFailed
			g.log.Warn("credential endpoint: upstream response cut", "alias", ev.Alias, "host", ev.Host, "err", err)
			panic(http.ErrAbortHandler)
		}
	}
}

// errBodyTooLarge ends a request body over the limit.
var errBodyTooLarge = errors.New("request body over the credential endpoint's limit")

// cappedBody reads a request body up to a limit, counting, each read
// bounded by idle; past the limit, or when a read times out, it fails,
// which aborts the upstream request.
type cappedBody struct {
	r       io.ReadCloser
	left    int64
	rc      *http.ResponseController
	idle    time.Duration
	cancel  context.CancelFunc // the upstream request's
	n       atomic.Int64
	over    atomic.Bool
	stalled atomic.Bool
}

// refusal is the note refusing the request for its body, or "".
func (b *cappedBody) refusal() string {
	switch {
	case b.over.Load():
		return NoteBodyTooLarge
	case b.stalled.Load():
		return NoteBodyStalled
	}
	return ""
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	_ = b.rc.SetReadDeadline(time.Now().Add(b.idle))
	n, err := b.r.Read(p)
	if errors.Is(err, os.ErrDeadlineExceeded) {
		b.stalled.Store(true)
		b.cancel() // a transport may wait for the host's answer first
	} else if err != nil {
		b.done() // the body is read: the answer may take its time
	}
	if int64(n) > b.left {
		b.over.Store(true)
		return 0, errBodyTooLarge
	}
	b.left -= int64(n)
	b.n.Add(int64(n))
	return n, err
}

// done lifts the bound on reads, unless the body stalled: the server
// then finds the rest of it gone at once instead of waiting for it.
func (b *cappedBody) done() {
	if !b.stalled.Load() {
		_ = b.rc.SetReadDeadline(time.Time{})
	}
}

func (b *cappedBody) Close() error { return b.r.Close() }
