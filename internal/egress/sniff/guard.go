package sniff

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"

	"isopod/internal/egress"
)

// Limits of what a Guard holds back while it checks.
const (
	maxHead      = 64 << 10 // an HTTP/1 head or trailer section; all that may precede the first check
	maxLine      = 8 << 10  // a first line, before the bytes are classified
	maxChunkLine = 4 << 10
	readSize     = 16 << 10
)

// Judge decides one name a connection carries: raw as the client sent it
// ("" when a request carries none), from egress.HostFromSNI or
// egress.HostFromHTTP. An allowed verdict's Host is the normalised name.
type Judge func(raw, from string) egress.Verdict

// Config configures a [Guard].
type Config struct {
	Judge Judge
	// Strict requires the bytes to be a TLS ClientHello or HTTP (ports 80
	// and 443). Otherwise bytes that are neither pass unchecked; bytes
	// that start as HTTP are still checked throughout.
	Strict bool
}

// Refusal is the error a Guard returns when what the client sent fails a
// check: the verdict to record (its Reason and Host).
type Refusal struct {
	Verdict egress.Verdict
	// HTTP is set when the refused bytes are an HTTP/1 request, so that an
	// HTTP response can answer it (if nothing was passed on before).
	HTTP  bool
	Cause error // what was wrong, when more than a name; may be nil
}

func (r *Refusal) Error() string {
	msg := "refused: " + r.Verdict.Reason
	if r.Verdict.Host != "" {
		msg += " " + r.Verdict.Host
	}
	if r.Cause != nil {
		msg += ": " + r.Cause.Error()
	}
	return msg
}

func (r *Refusal) Unwrap() error { return r.Cause }

// state is where a Guard is in the client's byte stream.
type state int

const (
	stStart     state = iota // nothing classified yet
	stHello                  // a TLS ClientHello
	stRequest                // HTTP/1: at a request boundary
	stBody                   // HTTP/1: passing g.left bytes of body or chunk data
	stChunkSize              // HTTP/1 chunked: at a chunk-size line
	stChunkEnd               // HTTP/1 chunked: the CRLF after chunk data
	stTrailers               // HTTP/1 chunked: the trailer section
	stAwait                  // HTTP/1: waiting for the server's answer to an Upgrade
	stPreface                // HTTP/2: the client connection preface
	stFrames                 // HTTP/2: frames
	stOpaque                 // unchecked from here on
)

// Guard reads a client's side of a connection and passes on, through Read,
// only bytes it has checked: the TLS ClientHello's server_name; every
// HTTP/1 request's target authority and Host, request after request on a
// kept-alive or pipelined connection, with strict framing so that the
// server sees exactly the requests the Guard saw; and, for HTTP/2
// cleartext (prior knowledge or an h2c upgrade), the :authority and host
// of every HEADERS frame. The names of one request must each pass the
// Judge and agree with each other. After a TLS ClientHello, or a protocol
// switch the server confirmed, the bytes pass unchecked.
//
// Read is for one goroutine; the Reader from Downstream for another.
type Guard struct {
	src   io.Reader
	cfg   Config
	buf   []byte // read from src, not yet parsed or passed on
	tmp   []byte
	out   []byte // checked, not yet returned by Read
	state state
	first *egress.Verdict
	err   error // sticky

	left     int64    // stBody
	chunked  bool     // the current request's body is chunked
	upgrades []string // the current request asks to switch protocols
	requests int      // HTTP/1 requests passed on
	h2       *h2Reader

	watching atomic.Bool // the server's answer to an Upgrade is awaited
	mu       sync.Mutex  // guards following
	cond     *sync.Cond
	answer   []byte // the server's bytes while watching
	answered bool
	next     state // what the answer decided
	downDone bool
}

// NewGuard returns a Guard over src.
func NewGuard(src io.Reader, cfg Config) *Guard {
	g := &Guard{src: src, cfg: cfg}
	g.cond = sync.NewCond(&g.mu)
	return g
}

// First reads until the first request (or ClientHello) has been judged and
// returns its verdict; for unchecked bytes (Strict unset) an allowed
// verdict with no Host. Its error is a *Refusal, also when the client
// ended, or its read deadline passed, before sending enough to judge.
// Nothing is passed on by Read before First has allowed.
func (g *Guard) First() (egress.Verdict, error) {
	for g.first == nil {
		if g.err != nil {
			return egress.Verdict{}, g.err
		}
		if err := g.step(); err != nil {
			g.err = err
		}
	}
	return *g.first, nil
}

// Read implements io.Reader. A check that fails ends the stream with a
// *Refusal; bytes checked before it have been returned.
func (g *Guard) Read(p []byte) (int, error) {
	if g.first == nil {
		if _, err := g.First(); err != nil {
			return 0, err
		}
	}
	for {
		if len(g.out) > 0 {
			n := copy(p, g.out)
			g.out = g.out[n:]
			return n, nil
		}
		if g.err != nil {
			return 0, g.err
		}
		switch g.state {
		case stOpaque:
			return g.readRaw(p)
		case stBody:
			return g.readBody(p)
		default:
			if err := g.step(); err != nil {
				g.err = err
			}
		}
	}
}

func (g *Guard) step() error {
	switch g.state {
	case stStart:
		return g.classify()
	case stHello:
		return g.hello()
	case stRequest:
		return g.request()
	case stChunkSize:
		return g.chunkSize()
	case stChunkEnd:
		return g.chunkEnd()
	case stTrailers:
		return g.trailers()
	case stAwait:
		return g.await()
	case stPreface:
		return g.preface()
	case stFrames:
		return g.frame()
	}
	return fmt.Errorf("sniff: no step in state %d", g.state)
}

// readRaw reads bytes already buffered, else from the source.
func (g *Guard) readRaw(p []byte) (int, error) {
	if len(g.buf) > 0 {
		n := copy(p, g.buf)
		g.buf = g.buf[n:]
		return n, nil
	}
	return g.src.Read(p)
}

// more reads more of the source into buf; errTooLong when buf already
// holds limit bytes.
func (g *Guard) more(limit int) error {
	if len(g.buf) >= limit {
		return errTooLong
	}
	if g.tmp == nil {
		g.tmp = make([]byte, readSize)
	}
	n, err := g.src.Read(g.tmp)
	g.buf = append(g.buf, g.tmp[:n]...)
	if n > 0 {
		return nil
	}
	return err
}

var errTooLong = errors.New("too long")

// pass moves n buffered bytes to the checked output.
func (g *Guard) pass(n int) {
	g.out = append(g.out, g.buf[:n]...)
	g.buf = g.buf[n:]
}

// refuse builds the Refusal for verdict v.
func refuse(v egress.Verdict, http bool, cause error) error {
	return &Refusal{Verdict: v, HTTP: http, Cause: cause}
}

// early is the error for the source ending (or failing) at a point where
// nothing more can be passed on: before the first check a refusal as for a
// missing name, after it the end of the stream.
func (g *Guard) early(from string, http bool, cause error) error {
	if g.first != nil {
		if errors.Is(cause, io.EOF) || errors.Is(cause, io.ErrUnexpectedEOF) || errors.Is(cause, errTooLong) {
			return io.EOF
		}
		return cause
	}
	return refuse(g.cfg.Judge("", from), http, cause)
}

// malformed refuses bytes that do not parse.
func (g *Guard) malformed(http bool, cause error) error {
	return refuse(egress.Verdict{Reason: egress.ReasonMalformed}, http, cause)
}

// approve records the first verdict.
func (g *Guard) approve(v egress.Verdict) {
	if g.first == nil {
		g.first = &v
	}
}

// judgeNames has every name judged and requires them to agree; it returns
// the verdict of the first.
func (g *Guard) judgeNames(names []string, from string) (egress.Verdict, bool) {
	if len(names) == 0 {
		return g.cfg.Judge("", from), false
	}
	var first egress.Verdict
	for i, n := range names {
		v := g.cfg.Judge(n, from)
		switch {
		case !v.Allow:
			return v, false
		case i == 0:
			first = v
		case v.Host != first.Host:
			return egress.Verdict{Reason: egress.ReasonHostMismatch, Host: v.Host}, false
		}
	}
	return first, true
}

// The HTTP/2 client connection preface (RFC 9113, 3.4).
const h2Preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

// classify looks at the first bytes: a TLS record, the HTTP/2 preface, an
// HTTP/1 request line, or something else.
func (g *Guard) classify() error {
	rest := bytes.TrimLeft(g.buf, "\r\n")
	if len(rest) == 0 || (len(rest) < len(h2Preface) && bytes.HasPrefix([]byte(h2Preface), rest)) {
		if err := g.more(maxLine); err != nil {
			return g.early(egress.HostFromHTTP, false, err)
		}
		return nil
	}
	switch {
	case rest[0] == 0x16:
		g.state = stHello
		return nil
	case bytes.HasPrefix(rest, []byte(h2Preface)):
		g.state = stPreface
		return nil
	case isTchar(rest[0]):
		i := bytes.IndexByte(rest, '\n')
		if i < 0 && len(rest) < maxLine {
			if err := g.more(maxHead); err != nil {
				return g.early(egress.HostFromHTTP, false, err)
			}
			return nil
		}
		if i < 0 || looksHTTP(rest[:i]) {
			g.state = stRequest
			return nil
		}
	}
	if g.cfg.Strict {
		return refuse(g.cfg.Judge("", egress.HostFromHTTP), false, ErrNotHTTP)
	}
	g.approve(egress.Verdict{Allow: true})
	g.state = stOpaque
	g.pass(len(g.buf))
	return nil
}

// hello checks a TLS ClientHello's server_name, then passes everything.
func (g *Guard) hello() error {
	sni, err := ParseClientHelloSNI(g.buf)
	if NeedMore(err) {
		if err := g.more(maxHead); err != nil {
			return g.early(egress.HostFromSNI, false, err)
		}
		return nil
	}
	if err != nil {
		return refuse(g.cfg.Judge("", egress.HostFromSNI), false, err)
	}
	v := g.cfg.Judge(sni, egress.HostFromSNI)
	if !v.Allow {
		return refuse(v, false, nil)
	}
	g.approve(v)
	g.state = stOpaque
	g.pass(len(g.buf))
	return nil
}
