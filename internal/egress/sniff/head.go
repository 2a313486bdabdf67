package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// Errors of the HTTP/1 head parser.
var (
	// ErrNotHTTP means the bytes do not start an HTTP/1 request at all.
	ErrNotHTTP = errors.New("not an HTTP/1 request")
	// ErrMalformed means the bytes start an HTTP/1 request that breaks
	// the syntax isopod accepts, or whose body length is ambiguous.
	ErrMalformed = errors.New("malformed HTTP/1 request")
)

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// Head is one parsed HTTP/1 request head.
type Head struct {
	Method, Target, Version string
	// Authority is the host of an absolute-form or authority-form target
	// (without port or brackets); AuthorityPort its port text ("" when
	// none). Both are empty for an origin-form or asterisk-form target.
	Authority, AuthorityPort string
	Scheme                   string // of an absolute-form target, lower case
	// Hosts are the host parts of the Host header fields, as sent.
	Hosts []string
	// ContentLength is the body length, -1 when the request has none
	// or is chunked.
	ContentLength int64
	Chunked       bool
	// Upgrade lists the protocols of the Upgrade header, lower case.
	Upgrade []string
}

// Names are the names the request carries: its target's authority, then
// each Host.
func (h *Head) Names() []string {
	var out []string
	if h.Authority != "" {
		out = append(out, h.Authority)
	}
	return append(out, h.Hosts...)
}

// headEnd returns the length of the head at the start of b (through the
// blank line), 0 when b holds no complete head yet, or an error when a line
// ends in a bare LF or a CR stands alone. Leading empty lines are part of
// the head.
func headEnd(b []byte) (int, error) {
	lineStart := 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '\r':
			if i+1 < len(b) && b[i+1] != '\n' {
				return 0, malformed("CR without LF")
			}
		case '\n':
			if i == 0 || b[i-1] != '\r' {
				return 0, malformed("line ends in a bare LF")
			}
			if i-1 == lineStart && !onlyCRLF(b[:lineStart]) {
				return i + 1, nil
			}
			lineStart = i + 1
		}
	}
	return 0, nil
}

// onlyCRLF reports whether b is empty lines only.
func onlyCRLF(b []byte) bool { return len(bytes.Trim(b, "\r\n")) == 0 }

// looksHTTP reports whether a request line is meant as HTTP/1 (as opposed
// to another protocol's first line): it names an HTTP version after a
// space.
func looksHTTP(line []byte) bool { return bytes.Contains(line, []byte(" HTTP/")) }

// ParseHead parses a complete request head (as delimited by the blank line;
// leading empty lines allowed). It is strict where servers differ: lines
// end in CRLF, no folded or space-padded field names, one Host, a single
// body length (Content-Length or chunked, never both), only HTTP/1.0 and
// HTTP/1.1.
func ParseHead(b []byte) (*Head, error) {
	b = bytes.TrimLeft(b, "\r\n")
	lines := strings.Split(strings.TrimSuffix(string(b), "\r\n\r\n"), "\r\n")
	if len(lines) == 0 || !looksHTTP([]byte(lines[0])) {
		return nil, ErrNotHTTP
	}
	h := &Head{ContentLength: -1}
	if err := h.parseRequestLine(lines[0]); err != nil {
		return nil, err
	}
	var cl []string
	var te []string
	for _, line := range lines[1:] {
		name, value, err := fieldLine(line)
		if err != nil {
			return nil, err
		}
		switch strings.ToLower(name) {
		case "host":
			h.Hosts = append(h.Hosts, HostOnly(value))
		case "content-length":
			cl = append(cl, strings.Split(value, ",")...)
		case "transfer-encoding":
			te = append(te, strings.Split(value, ",")...)
		case "upgrade":
			for p := range strings.SplitSeq(value, ",") {
				proto, _, _ := strings.Cut(strings.TrimSpace(p), "/")
				h.Upgrade = append(h.Upgrade, strings.ToLower(proto))
			}
		}
	}
	if len(h.Hosts) > 1 {
		return nil, malformed("%d Host fields", len(h.Hosts))
	}
	if err := h.setFraming(cl, te); err != nil {
		return nil, err
	}
	return h, nil
}

// parseRequestLine reads "METHOD SP TARGET SP HTTP/1.x".
func (h *Head) parseRequestLine(line string) error {
	parts := strings.Split(line, " ")
	if len(parts) != 3 {
		return malformed("request line with %d fields", len(parts))
	}
	h.Method, h.Target, h.Version = parts[0], parts[1], parts[2]
	switch {
	case !isToken(h.Method):
		return malformed("bad method")
	case h.Version != "HTTP/1.1" && h.Version != "HTTP/1.0":
		return malformed("version %.16q", h.Version)
	case h.Target == "" || strings.IndexFunc(h.Target, func(r rune) bool { return r < 0x21 || r == 0x7f }) >= 0:
		return malformed("bad request target")
	}
	switch {
	case h.Method == "CONNECT":
		return h.setAuthority(h.Target)
	case h.Target[0] == '/', h.Target == "*":
		return nil
	}
	scheme, rest, ok := strings.Cut(h.Target, "://")
	if !ok || !isScheme(scheme) {
		return malformed("request target is neither a path nor an absolute URL")
	}
	h.Scheme = strings.ToLower(scheme)
	auth := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		auth = rest[:i]
	}
	return h.setAuthority(auth)
}

// setAuthority records a target's authority (host[:port]).
func (h *Head) setAuthority(auth string) error {
	if auth == "" || strings.ContainsAny(auth, "@/\\") {
		return malformed("bad authority in the request target")
	}
	h.Authority, h.AuthorityPort = splitHostPort(auth)
	if h.Authority == "" {
		return malformed("empty host in the request target")
	}
	return nil
}

// setFraming decides the body length from the Content-Length and
// Transfer-Encoding values.
func (h *Head) setFraming(cl, te []string) error {
	if len(te) > 0 {
		if len(cl) > 0 {
			return malformed("both Content-Length and Transfer-Encoding")
		}
		if h.Version == "HTTP/1.0" {
			return malformed("Transfer-Encoding in an HTTP/1.0 request")
		}
		for i, c := range te {
			c = strings.ToLower(strings.TrimSpace(c))
			if !isToken(c) || (c == "chunked") != (i == len(te)-1) {
				return malformed("transfer codings must end in one chunked")
			}
		}
		h.Chunked = true
		return nil
	}
	for _, v := range cl {
		v = strings.TrimSpace(v)
		if v == "" || len(v) > 18 || strings.Trim(v, "0123456789") != "" {
			return malformed("bad Content-Length")
		}
		n, _ := strconv.ParseInt(v, 10, 64)
		if h.ContentLength >= 0 && n != h.ContentLength {
			return malformed("differing Content-Length values")
		}
		h.ContentLength = n
	}
	return nil
}

// fieldLine splits "name: value", trimming the value's blanks.
func fieldLine(line string) (name, value string, err error) {
	name, value, ok := strings.Cut(line, ":")
	switch {
	case !ok:
		return "", "", malformed("field line without a colon")
	case !isToken(name):
		return "", "", malformed("bad field name (folded line, or blanks before the colon)")
	case strings.IndexByte(value, 0) >= 0:
		return "", "", malformed("NUL in a field value")
	}
	return name, strings.Trim(value, " \t"), nil
}

// HostOnly strips the port from a Host value or an authority: "a:80" is
// "a", "[2001:db8::1]:80" is "2001:db8::1". A value it cannot split is
// returned whole, to fail as a name.
func HostOnly(s string) string {
	host, _ := splitHostPort(s)
	return host
}

// splitHostPort splits an authority into its host and its port's digits
// ("" when there is no port, or nothing after the colon).
func splitHostPort(s string) (host, port string) {
	if strings.HasPrefix(s, "[") {
		i := strings.IndexByte(s, ']')
		if i < 0 || !isPort(s[i+1:]) {
			return s, ""
		}
		return s[1:i], strings.TrimPrefix(s[i+1:], ":")
	}
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[:i], ":") && isPort(s[i:]) {
		return s[:i], s[i+1:]
	}
	return s, ""
}

// isPort reports whether s is "" or ":" followed by digits only.
func isPort(s string) bool {
	if s == "" {
		return true
	}
	return s[0] == ':' && strings.Trim(s[1:], "0123456789") == ""
}

// isToken reports whether s is an RFC 9110 token.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !isTchar(s[i]) {
			return false
		}
	}
	return true
}

func isTchar(c byte) bool {
	switch {
	case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// isScheme reports whether s is a URI scheme.
func isScheme(s string) bool {
	if s == "" || !(s[0] >= 'a' && s[0] <= 'z' || s[0] >= 'A' && s[0] <= 'Z') {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// ReadHead reads one request head from r, through its blank line and no
// further, and parses it (see ParseHead). It returns the bytes read, also
// on error; io.EOF with none means the client sent nothing.
func ReadHead(r *bufio.Reader) (*Head, []byte, error) {
	var raw []byte
	for {
		line, err := r.ReadSlice('\n')
		raw = append(raw, line...)
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
		case err != nil:
			if len(raw) > 0 && errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return nil, raw, err
		}
		if len(raw) > maxHead {
			return nil, raw, malformed("request head over %d bytes", maxHead)
		}
		if err != nil {
			continue
		}
		// Check the line just completed (which may have begun in an
		// earlier, full buffer).
		start := bytes.LastIndexByte(raw[:len(raw)-1], '\n') + 1
		if _, herr := headEnd(raw[start:]); herr != nil || !bytes.HasSuffix(raw, []byte("\r\n")) {
			return nil, raw, malformed("line ends in a bare LF, or has a lone CR")
		}
		if len(raw)-start == 2 && !onlyCRLF(raw[:start]) {
			h, err := ParseHead(raw)
			return h, raw, err
		}
	}
}
