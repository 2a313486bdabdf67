package credential

import (
	"strings"

	"isopod/internal/egress"
)

// target is an endpoint request's target, split.
type target struct {
	alias string // the first segment, as sent
	rest  string // the path after the alias, as sent ("" for none)
	query string // after '?', verbatim
	hasQ  bool
}

// splitTarget splits a request target (origin form, or absolute form
// http://<any authority>/...) into alias, rest and query. ok is false
// for any other form.
func splitTarget(raw string) (t target, ok bool) {
	if len(raw) >= 7 && strings.EqualFold(raw[:7], "http://") {
		i := strings.IndexByte(raw[7:], '/')
		if i < 0 {
			return target{}, false
		}
		raw = raw[7+i:]
	}
	if !strings.HasPrefix(raw, "/") {
		return target{}, false
	}
	p, q, hasQ := strings.Cut(raw, "?")
	var more bool
	if t.alias, t.rest, more = strings.Cut(p[1:], "/"); more {
		t.rest = "/" + t.rest
	}
	t.query, t.hasQ = q, hasQ
	return t, true
}

// normalPath checks the path after the alias ("" or starting with '/')
// and returns it as the upstream path ("/" for none): only the characters
// of a URL path (RFC 3986 pchar and '/', without ';'), escapes only as
// %XX of a byte other than a control, space, DEL, '%', '/', '\', '.' and
// ';', no empty segment but a trailing one, no "." or ".." segment. The
// path is passed on as sent: nothing is decoded, so nothing decodes into
// what these rules refuse.
func normalPath(rest string) (string, bool) {
	if rest == "" {
		return "/", true
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		switch {
		case c == '%':
			if i+2 >= len(rest) || !isHex(rest[i+1]) || !isHex(rest[i+2]) {
				return "", false
			}
			if d := unhex(rest[i+1])<<4 | unhex(rest[i+2]); d <= ' ' || d == 0x7f || strings.IndexByte(`%/\.;`, d) >= 0 {
				return "", false
			}
			i += 2
		case !pathChar(c):
			return "", false
		}
	}
	segs := strings.Split(rest[1:], "/")
	for i, s := range segs {
		if s == "" && i != len(segs)-1 || s == "." || s == ".." {
			return "", false
		}
	}
	return rest, true
}

// pathChar reports whether c may appear unescaped in a path: RFC 3986's
// unreserved and sub-delims (but ';'), ':', '@' and '/'.
func pathChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,=:@/", c) >= 0
}

// goodQuery reports whether a query may be passed on verbatim: visible
// ASCII, no '#'.
func goodQuery(q string) bool {
	for i := 0; i < len(q); i++ {
		if q[i] < 0x21 || q[i] > 0x7e || q[i] == '#' {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func unhex(c byte) byte {
	switch {
	case c <= '9':
		return c - '0'
	case c >= 'a':
		return c - 'a' + 10
	}
	return c - 'A' + 10
}

// recordable is s as a record may show it: s when it is at most max
// visible ASCII bytes, else "<invalid:N>" with its length only.
func recordable(s string, max int) string {
	if s == "" || len(s) <= max && visible(s) {
		return s
	}
	return egress.InvalidHost(len(s))
}
