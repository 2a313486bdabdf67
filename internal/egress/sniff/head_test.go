package sniff

import (
	"bufio"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseHead(t *testing.T) {
	tests := []struct {
		name, in string
		names    []string // nil with err
		cl       int64
		chunked  bool
		err      error
	}{
		{"origin form", "GET /x HTTP/1.1\r\nHost: ok.test\r\n\r\n", []string{"ok.test"}, -1, false, nil},
		{"host with port", "GET / HTTP/1.1\r\nhost:  OK.test:8080 \r\n\r\n", []string{"OK.test"}, -1, false, nil},
		{"absolute form", "GET http://ok.test/b HTTP/1.1\r\nHost: evil.test\r\n\r\n", []string{"ok.test", "evil.test"}, -1, false, nil},
		{"absolute form with port and query", "GET http://ok.test:81?q HTTP/1.0\r\n\r\n", []string{"ok.test"}, -1, false, nil},
		{"connect", "CONNECT ok.test:443 HTTP/1.1\r\nHost: ok.test:443\r\n\r\n", []string{"ok.test", "ok.test"}, -1, false, nil},
		{"ipv6 host", "GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n", []string{"2001:db8::1"}, -1, false, nil},
		{"no host", "GET / HTTP/1.0\r\n\r\n", nil, -1, false, nil},
		{"leading empty lines", "\r\n\r\nPOST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\n", []string{"a"}, 5, false, nil},
		{"same lengths twice", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\nContent-Length: 5\r\n\r\n", []string{"a"}, 5, false, nil},
		{"chunked", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n", []string{"a"}, -1, true, nil},

		{"not http", "SSH-2.0-OpenSSH_9.2p1 Debian\r\n\r\n", nil, 0, false, ErrNotHTTP},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: a\r\n\r\n", nil, 0, false, ErrMalformed},
		{"length and chunked", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n", nil, 0, false, ErrMalformed},
		{"differing lengths", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", nil, 0, false, ErrMalformed},
		{"signed length", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\n", nil, 0, false, ErrMalformed},
		{"chunked not last", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", nil, 0, false, ErrMalformed},
		{"chunked in 1.0", "POST / HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", nil, 0, false, ErrMalformed},
		{"space before colon", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n", nil, 0, false, ErrMalformed},
		{"folded line", "GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n", nil, 0, false, ErrMalformed},
		{"no colon", "GET / HTTP/1.1\r\nHost a\r\n\r\n", nil, 0, false, ErrMalformed},
		{"http/2 version", "GET / HTTP/2.0\r\nHost: a\r\n\r\n", nil, 0, false, ErrMalformed},
		{"extra space", "GET  / HTTP/1.1\r\nHost: a\r\n\r\n", nil, 0, false, ErrMalformed},
		{"userinfo", "GET http://evil.test@ok.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", nil, 0, false, ErrMalformed},
		{"empty authority", "GET http:///x HTTP/1.1\r\nHost: ok.test\r\n\r\n", nil, 0, false, ErrMalformed},
		{"relative target", "GET x HTTP/1.1\r\nHost: ok.test\r\n\r\n", nil, 0, false, ErrMalformed},
		{"control in target", "GET /\x01 HTTP/1.1\r\nHost: ok.test\r\n\r\n", nil, 0, false, ErrMalformed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h, err := ParseHead([]byte(tt.in))
			if tt.err != nil {
				if !errors.Is(err, tt.err) {
					t.Fatalf("ParseHead = %+v, %v; want %v", h, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseHead: %v", err)
			}
			if got := h.Names(); !slices.Equal(got, tt.names) || h.ContentLength != tt.cl || h.Chunked != tt.chunked {
				t.Errorf("names %q length %d chunked %v; want %q %d %v", got, h.ContentLength, h.Chunked, tt.names, tt.cl, tt.chunked)
			}
		})
	}
}

func TestHeadEnd(t *testing.T) {
	for _, tt := range []struct {
		in   string
		n    int
		fail bool
	}{
		{"GET / HTTP/1.1\r\n\r\nrest", 18, false},
		{"\r\n\r\nGET / HTTP/1.1\r\n\r\n", 22, false},
		{"GET / HTTP/1.1\r\nHost: a\r\n", 0, false},
		{"GET / HTTP/1.1\r", 0, false},
		{"GET / HTTP/1.1\nHost: a\n\n", 0, true},
		{"GET / HTTP/1.1\r\nHost: a\rb\r\n\r\n", 0, true},
	} {
		n, err := headEnd([]byte(tt.in))
		if n != tt.n || (err != nil) != tt.fail {
			t.Errorf("headEnd(%q) = %d, %v; want %d fail=%v", tt.in, n, err, tt.n, tt.fail)
		}
	}
}

func TestHostOnly(t *testing.T) {
	for in, want := range map[string]string{
		"ok.test": "ok.test", "ok.test:80": "ok.test", "ok.test:": "ok.test", "[2001:db8::1]:443": "2001:db8::1",
		"[2001:db8::1]": "2001:db8::1", "2001:db8::1": "2001:db8::1", "ok.test:x": "ok.test:x", "[::1]x": "[::1]x",
	} {
		if got := HostOnly(in); got != want {
			t.Errorf("HostOnly(%q) = %q; want %q", in, got, want)
		}
	}
}

func TestReadHead(t *testing.T) {
	in := "\r\nGET http://ok.test/ HTTP/1.1\r\nHost: ok.test\r\n" + "X-Long: " + strings.Repeat("x", 5000) + "\r\n\r\nbody"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	h, raw, err := ReadHead(br)
	if err != nil || h.Authority != "ok.test" || string(raw) != in[:len(in)-4] {
		t.Fatalf("ReadHead = %+v, %d bytes, %v", h, len(raw), err)
	}
	if rest, _ := io.ReadAll(br); string(rest) != "body" {
		t.Errorf("left %q after the head; want the body", rest)
	}
	for in, want := range map[string]error{
		"":                            io.EOF,
		"GET / HTTP/1.1\r\nHost: a":   io.ErrUnexpectedEOF,
		"GET / HTTP/1.1\nHost: a\n\n": ErrMalformed,
		"GARBAGE\r\n\r\n":             ErrNotHTTP,
		"GET / HTTP/1.1\r\n" + strings.Repeat("X-A: b\r\n", 10000): ErrMalformed,
	} {
		if _, _, err := ReadHead(bufio.NewReader(strings.NewReader(in))); !errors.Is(err, want) {
			t.Errorf("ReadHead(%.30q) = %v; want %v", in, err, want)
		}
	}
}
