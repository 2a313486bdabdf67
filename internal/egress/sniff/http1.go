package sniff

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"

	"isopod/internal/egress"
)

// request checks the HTTP/1 request head at a request boundary (or the
// HTTP/2 preface, when the client switches after an h2c upgrade).
func (g *Guard) request() error {
	rest := bytes.TrimLeft(g.buf, "\r\n")
	if len(rest) < len(h2Preface) && bytes.HasPrefix([]byte(h2Preface), rest) {
		if err := g.more(maxHead); err != nil {
			return g.early(egress.HostFromHTTP, true, err)
		}
		return nil
	}
	if bytes.HasPrefix(rest, []byte(h2Preface)) {
		g.pass(len(g.buf) - len(rest))
		g.state = stPreface
		return nil
	}
	n, err := headEnd(g.buf)
	if err != nil {
		return g.malformed(true, err)
	}
	if n == 0 {
		if err := g.more(maxHead); errors.Is(err, errTooLong) {
			return g.malformed(true, fmt.Errorf("request head over %d bytes: %w", maxHead, ErrMalformed))
		} else if err != nil {
			return g.early(egress.HostFromHTTP, true, err)
		}
		return nil
	}
	h, err := ParseHead(g.buf[:n])
	if err != nil {
		if errors.Is(err, ErrNotHTTP) && g.first == nil && g.cfg.Strict {
			return refuse(g.cfg.Judge("", egress.HostFromHTTP), false, err)
		}
		return g.malformed(true, err)
	}
	v, ok := g.judgeNames(h.Names(), egress.HostFromHTTP)
	if !ok {
		return refuse(v, true, nil)
	}
	g.upgrades = nil
	if len(h.Upgrade) > 0 && !onlyH2C(h.Upgrade) {
		if g.requests > 0 {
			return refuse(egress.Verdict{Reason: egress.ReasonBadRequest, Host: v.Host}, true,
				errors.New("a protocol upgrade after the first request of a connection"))
		}
		g.upgrades = h.Upgrade
		g.watching.Store(true)
	}
	g.approve(v)
	g.pass(n)
	switch {
	case h.Chunked:
		g.chunked = true
		g.state = stChunkSize
	case h.ContentLength > 0:
		g.chunked = false
		g.left = h.ContentLength
		g.state = stBody
	default:
		g.requestDone()
	}
	return nil
}

func onlyH2C(protos []string) bool {
	for _, p := range protos {
		if p != "h2c" {
			return false
		}
	}
	return true
}

// requestDone moves past a request whose body has been passed on.
func (g *Guard) requestDone() {
	g.requests++
	g.state = stRequest
	if len(g.upgrades) > 0 {
		g.state = stAwait
	}
}

// readBody passes body bytes (or chunk data) straight through.
func (g *Guard) readBody(p []byte) (int, error) {
	if int64(len(p)) > g.left {
		p = p[:g.left]
	}
	n, err := g.readRaw(p)
	g.left -= int64(n)
	if g.left == 0 {
		if g.chunked {
			g.state = stChunkEnd
		} else {
			g.requestDone()
		}
	}
	if err != nil {
		g.err = err
		if n > 0 {
			err = nil
		}
	}
	return n, err
}

// chunkSize checks a chunk-size line: hex digits, then optional
// extensions without control characters.
func (g *Guard) chunkSize() error {
	i := bytes.Index(g.buf, []byte("\r\n"))
	if i < 0 {
		if bytes.IndexByte(g.buf, '\n') >= 0 {
			return g.malformed(false, fmt.Errorf("%w: chunk-size line ends in a bare LF", ErrMalformed))
		}
		if err := g.more(maxChunkLine); errors.Is(err, errTooLong) {
			return g.malformed(false, fmt.Errorf("%w: chunk-size line too long", ErrMalformed))
		} else if err != nil {
			return g.early(egress.HostFromHTTP, false, err)
		}
		return nil
	}
	line := g.buf[:i]
	digits := len(line) - len(bytes.TrimLeft(line, "0123456789abcdefABCDEF"))
	ext := line[digits:]
	if digits == 0 || digits > 15 || (len(ext) > 0 && bytes.TrimLeft(ext, " \t")[0] != ';') || hasCTL(ext) {
		return g.malformed(false, fmt.Errorf("%w: bad chunk-size line", ErrMalformed))
	}
	size, _ := strconv.ParseInt(string(line[:digits]), 16, 64)
	g.pass(i + 2)
	if size == 0 {
		g.state = stTrailers
		return nil
	}
	g.left = size
	g.state = stBody
	return nil
}

// hasCTL reports control characters other than HTAB (a chunk extension's
// quoted strings and tokens have none).
func hasCTL(b []byte) bool {
	for _, c := range b {
		if (c < 0x20 && c != '\t') || c == 0x7f {
			return true
		}
	}
	return false
}

// chunkEnd checks the CRLF that closes chunk data.
func (g *Guard) chunkEnd() error {
	if len(g.buf) < 2 {
		if err := g.more(2); err != nil {
			return g.early(egress.HostFromHTTP, false, err)
		}
		return nil
	}
	if g.buf[0] != '\r' || g.buf[1] != '\n' {
		return g.malformed(false, fmt.Errorf("%w: chunk data not followed by CRLF", ErrMalformed))
	}
	g.pass(2)
	g.state = stChunkSize
	return nil
}

// trailers checks the trailer section that ends a chunked body.
func (g *Guard) trailers() error {
	n, err := trailerEnd(g.buf)
	if err != nil {
		return g.malformed(false, err)
	}
	if n == 0 {
		if err := g.more(maxHead); errors.Is(err, errTooLong) {
			return g.malformed(false, fmt.Errorf("%w: trailer section too long", ErrMalformed))
		} else if err != nil {
			return g.early(egress.HostFromHTTP, false, err)
		}
		return nil
	}
	if n > 2 {
		for line := range bytes.SplitSeq(g.buf[:n-4], []byte("\r\n")) {
			if _, _, err := fieldLine(string(line)); err != nil {
				return g.malformed(false, err)
			}
		}
	}
	g.pass(n)
	g.requestDone()
	return nil
}

// trailerEnd returns the length of the trailer section at the start of b
// (through its blank line), 0 when incomplete.
func trailerEnd(b []byte) (int, error) {
	if bytes.HasPrefix(b, []byte("\r\n")) {
		return 2, nil
	}
	return headEnd(b)
}
