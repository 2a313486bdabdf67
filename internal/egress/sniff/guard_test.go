package sniff

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/testnet"
)

// judgeNames allows the given names, as a tunnel to one of them would.
func judgeNames(names ...string) Judge {
	return func(raw, from string) egress.Verdict { return egress.MatchName(raw, from, names) }
}

// drain reads the whole guarded stream: what passed, and how it ended
// (nil at a clean end).
func drain(g *Guard) (string, error) {
	b, err := io.ReadAll(g)
	return string(b), err
}

const (
	okGet   = "GET /a HTTP/1.1\r\nHost: ok.test\r\n\r\n"
	evilGet = "GET /b HTTP/1.1\r\nHost: evil.test\r\n\r\n" // 36 (0x24) bytes
)

func TestGuardHTTP1(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		strict bool
		passed string // everything the server may see
		reason string // "" for a clean end
		host   string // the refused name
		http   bool   // the refusal may be answered with 403
	}{
		{"one request", okGet, true, okGet, "", "", false},
		{"host header fronting", evilGet, true, "", egress.ReasonHostMismatch, "evil.test", true},
		{"request line fronting", "GET http://ok.test/b HTTP/1.1\r\nHost: evil.test\r\n\r\n", true, "", egress.ReasonHostMismatch, "evil.test", true},
		{"request line elsewhere", "GET http://evil.test/b HTTP/1.1\r\nHost: ok.test\r\n\r\n", true, "", egress.ReasonHostMismatch, "evil.test", true},
		{"names agree", "GET http://OK.test:80/b HTTP/1.1\r\nHost: ok.test.\r\n\r\n", true, "GET http://OK.test:80/b HTTP/1.1\r\nHost: ok.test.\r\n\r\n", "", "", false},
		{"no host", "GET / HTTP/1.0\r\n\r\n", true, "", egress.ReasonHostMismatch, "", true},
		{"address as host", "GET / HTTP/1.1\r\nHost: 203.0.113.10\r\n\r\n", true, "", egress.ReasonHostMismatch, "203.0.113.10", true},
		{"hostile host", "GET / HTTP/1.1\r\nHost: evil\x1b[2J.test\r\n\r\n", true, "", egress.ReasonHostMismatch, "<invalid:13>", true},
		{"pipelined", okGet + evilGet, true, okGet, egress.ReasonHostMismatch, "evil.test", true},
		{"pipelined via request line", okGet + "GET http://evil.test/ HTTP/1.1\r\nHost: ok.test\r\n\r\n", true, okGet, egress.ReasonHostMismatch, "evil.test", true},
		{"kept alive, three", okGet + okGet + okGet, true, okGet + okGet + okGet, "", "", false},
		{"body is not a request",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 36\r\n\r\n" + evilGet + okGet, true,
			"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 36\r\n\r\n" + evilGet + okGet, "", "", false},
		{"request after a body",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\n\r\nabc" + evilGet, true,
			"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 3\r\n\r\nabc", egress.ReasonHostMismatch, "evil.test", true},
		{"chunked body",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n24;x=y\r\n" + evilGet + "\r\n0\r\nX-T: 1\r\n\r\n" + evilGet, true,
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n24;x=y\r\n" + evilGet + "\r\n0\r\nX-T: 1\r\n\r\n", egress.ReasonHostMismatch, "evil.test", true},
		{"chunk size with a bare LF",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n", true,
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n", egress.ReasonMalformed, "", false},
		{"chunk data too long",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n", true,
			"POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel", egress.ReasonMalformed, "", false},
		{"smuggling with both lengths",
			"POST / HTTP/1.1\r\nHost: ok.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + evilGet, true,
			"", egress.ReasonMalformed, "", true},
		{"second request malformed", okGet + "GET / HTTP/1.1\r\nHost : evil.test\r\n\r\n", true, okGet, egress.ReasonMalformed, "", true},
		{"bare LF", "GET / HTTP/1.1\nHost: ok.test\n\n", true, "", egress.ReasonMalformed, "", true},
		{"upgrade later in a connection", okGet + "GET / HTTP/1.1\r\nHost: ok.test\r\nUpgrade: websocket\r\n\r\n", true, okGet, egress.ReasonBadRequest, "ok.test", true},
		{"not http on port 80", "SSH-2.0-OpenSSH_9.2p1 Debian\r\n", true, "", egress.ReasonHostMismatch, "", false},
		{"not http elsewhere", "SSH-2.0-OpenSSH_9.2p1 Debian\r\nmore", false, "SSH-2.0-OpenSSH_9.2p1 Debian\r\nmore", "", "", false},
		{"binary elsewhere", "\x00\x00\x00\x08\x04\xd2\x16\x2f", false, "\x00\x00\x00\x08\x04\xd2\x16\x2f", "", "", false},
		{"http elsewhere is checked", evilGet, false, "", egress.ReasonHostMismatch, "evil.test", true},
		{"http elsewhere, pipelined", okGet + evilGet, false, okGet, egress.ReasonHostMismatch, "evil.test", true},
		{"nothing at all", "", true, "", egress.ReasonHostMismatch, "", false},
		{"half a head", "GET / HTTP/1.1\r\nHost: ok", true, "", egress.ReasonHostMismatch, "", true},
		{"half a second head", okGet + "GET / HTTP/1.1\r\nHost: ev", true, okGet, "", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := NewGuard(strings.NewReader(tt.in), Config{Judge: judgeNames("ok.test"), Strict: tt.strict})
			passed, err := drain(g)
			if passed != tt.passed {
				t.Errorf("passed %q; want %q", passed, tt.passed)
			}
			var r *Refusal
			switch {
			case tt.reason == "" && err != nil:
				t.Errorf("ended with %v; want a clean end", err)
			case tt.reason != "" && !errors.As(err, &r):
				t.Errorf("ended with %v; want a refusal (%s)", err, tt.reason)
			case tt.reason != "" && (r.Verdict.Reason != tt.reason || r.Verdict.Host != tt.host || r.HTTP != tt.http):
				t.Errorf("refusal %+v http=%v; want %s host %q http=%v", r.Verdict, r.HTTP, tt.reason, tt.host, tt.http)
			}
		})
	}
}

// slowReader returns one byte a read, as a client trickling its request.
type slowReader struct{ s string }

func (r *slowReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

func TestGuardByteAtATime(t *testing.T) {
	in := "POST / HTTP/1.1\r\nHost: ok.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n" + okGet
	g := NewGuard(&slowReader{in + evilGet}, Config{Judge: judgeNames("ok.test"), Strict: true})
	passed, err := drain(g)
	var r *Refusal
	if passed != in || !errors.As(err, &r) || r.Verdict.Host != "evil.test" {
		t.Errorf("passed %q, %v; want the first two requests and a refusal of evil.test", passed, err)
	}
}

func TestGuardFirst(t *testing.T) {
	g := NewGuard(strings.NewReader("GET / HTTP/1.1\r\nHost: OK.test\r\nContent-Length: 2\r\n\r\nhi"), Config{Judge: judgeNames("ok.test"), Strict: true})
	v, err := g.First()
	if err != nil || !v.Allow || v.Host != "ok.test" || v.Reason != egress.ReasonAllowedHost {
		t.Fatalf("First = %+v, %v", v, err)
	}
	if passed, err := drain(g); err != nil || !strings.HasSuffix(passed, "\r\n\r\nhi") {
		t.Errorf("after First: %q, %v", passed, err)
	}
	// A client that sends nothing before its deadline is refused, not
	// allowed: there is nothing to judge.
	pr, pw := io.Pipe()
	defer pw.Close()
	g = NewGuard(&deadlineReader{pr, 50 * time.Millisecond}, Config{Judge: judgeNames("ok.test"), Strict: true})
	var r *Refusal
	if _, err := g.First(); !errors.As(err, &r) || r.Verdict.Reason != egress.ReasonHostMismatch {
		t.Errorf("silent client: %v; want a host_mismatch refusal", err)
	}
}

// deadlineReader fails a read that waits longer than d, as a connection
// with a read deadline does.
type deadlineReader struct {
	r io.Reader
	d time.Duration
}

var errDeadline = errors.New("deadline exceeded")

func (r *deadlineReader) Read(p []byte) (int, error) {
	type res struct {
		n   int
		err error
	}
	c := make(chan res, 1)
	go func() { n, err := r.r.Read(p); c <- res{n, err} }()
	select {
	case x := <-c:
		return x.n, x.err
	case <-time.After(r.d):
		return 0, errDeadline
	}
}

func TestGuardTLS(t *testing.T) {
	for _, tt := range []struct {
		sni, reason, host string
	}{
		{"ok.test", "", ""},
		{"evil.test", egress.ReasonSNIMismatch, "evil.test"},
		{"203.0.113.10", egress.ReasonSNIMismatch, ""}, // no SNI at all
	} {
		hello := testnet.ClientHello(t, tt.sni)
		in := string(hello) + "\x17\x03\x03 encrypted " + evilGet
		for _, strict := range []bool{true, false} {
			g := NewGuard(&slowReader{in}, Config{Judge: judgeNames("ok.test"), Strict: strict})
			passed, err := drain(g)
			var r *Refusal
			if tt.reason == "" {
				if err != nil || passed != in {
					t.Errorf("SNI %s strict=%v: %d bytes passed, %v; want all, unchecked after the hello", tt.sni, strict, len(passed), err)
				}
				continue
			}
			if passed != "" || !errors.As(err, &r) || r.Verdict.Reason != tt.reason || r.Verdict.Host != tt.host || r.HTTP {
				t.Errorf("SNI %s strict=%v: passed %d bytes, %v; want %s %q", tt.sni, strict, len(passed), err, tt.reason, tt.host)
			}
		}
	}
}

func TestGuardUpgrade(t *testing.T) {
	ws := "GET /ws HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"
	frames := "\x81\x85\x37\xfa\x21\x3d\x7f\x9f\x4d\x51\x58"
	for _, tt := range []struct {
		name, answer, after string
		passed              string
		refused             bool
	}{
		{"switched", "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", frames, ws + frames, false},
		{"after an interim answer", "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", frames, ws + frames, false},
		{"declined, then fronting", "HTTP/1.1 426 Upgrade Required\r\nContent-Length: 0\r\n\r\n", evilGet, ws, true},
		{"declined, then not http", "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", frames, ws, false}, // held, never a request
		{"no answer", "", evilGet, ws, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			g := NewGuard(strings.NewReader(ws+tt.after), Config{Judge: judgeNames("ok.test"), Strict: true})
			if _, err := g.First(); err != nil {
				t.Fatal(err)
			}
			head := make([]byte, len(ws))
			if _, err := io.ReadFull(g, head); err != nil || string(head) != ws {
				t.Fatalf("upgrade request: %q, %v", head, err)
			}
			// The server answers; the Guard watches its side.
			if _, err := io.ReadAll(g.Downstream(strings.NewReader(tt.answer))); err != nil {
				t.Fatal(err)
			}
			rest, err := drain(g)
			var r *Refusal
			if ws+rest != tt.passed || errors.As(err, &r) != tt.refused {
				t.Errorf("passed %q, %v; want %q refused=%v", ws+rest, err, tt.passed, tt.refused)
			}
		})
	}
}

// TestGuardWaitsForTheAnswer: bytes after an Upgrade request are held until
// the server has answered.
func TestGuardWaitsForTheAnswer(t *testing.T) {
	ws := "GET /ws HTTP/1.1\r\nHost: ok.test\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
	g := NewGuard(strings.NewReader(ws+"frames"), Config{Judge: judgeNames("ok.test"), Strict: true})
	head := make([]byte, len(ws))
	if _, err := io.ReadFull(g, head); err != nil {
		t.Fatal(err)
	}
	got := make(chan string, 1)
	go func() { b, _ := io.ReadAll(g); got <- string(b) }()
	select {
	case b := <-got:
		t.Fatalf("passed %q before the server answered", b)
	case <-time.After(50 * time.Millisecond):
	}
	pr, pw := io.Pipe()
	go io.Copy(io.Discard, g.Downstream(pr))
	io.WriteString(pw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n")
	select {
	case b := <-got:
		if b != "frames" {
			t.Errorf("after 101: %q", b)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("still held after the 101")
	}
	pw.Close()
}

func TestRefusalError(t *testing.T) {
	r := &Refusal{Verdict: egress.Verdict{Reason: egress.ReasonMalformed}, Cause: ErrMalformed}
	if !errors.Is(r, ErrMalformed) || !strings.Contains(r.Error(), "malformed") {
		t.Errorf("refusal %v", r)
	}
	var b bytes.Buffer
	WriteForbidden(&b, egress.ReasonHostMismatch)
	if !strings.HasPrefix(b.String(), "HTTP/1.1 403 Forbidden\r\n") || !strings.HasSuffix(b.String(), "(host_mismatch); see the run's egress record\n") {
		t.Errorf("403: %q", b.String())
	}
}
