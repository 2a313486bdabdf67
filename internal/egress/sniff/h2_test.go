package sniff

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"isopod/internal/egress"
)

// h2Client writes what an HTTP/2 client sends, with one HPACK encoder for
// the connection, as a real client does.
type h2Client struct {
	buf bytes.Buffer
	fr  *http2.Framer
	enc *hpack.Encoder
	hb  bytes.Buffer
}

func newH2Client(preface bool) *h2Client {
	c := &h2Client{}
	if preface {
		c.buf.WriteString(http2.ClientPreface)
	}
	c.fr = http2.NewFramer(&c.buf, nil)
	c.enc = hpack.NewEncoder(&c.hb)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
	c.fr.WriteWindowUpdate(0, 1<<20)
	return c
}

// request sends a HEADERS frame (split into CONTINUATIONs when split) with
// the given fields, then a DATA frame.
func (c *h2Client) request(stream uint32, split bool, fields ...string) {
	c.hb.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	block := c.hb.Bytes()
	if !split || len(block) < 2 {
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block, EndHeaders: true})
	} else {
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: stream, BlockFragment: block[:1]})
		c.fr.WriteContinuation(stream, true, block[1:])
	}
	c.fr.WriteData(stream, true, []byte("GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n"))
}

func get(authority string) []string {
	return []string{":method", "GET", ":scheme", "http", ":authority", authority, ":path", "/"}
}

func TestGuardHTTP2(t *testing.T) {
	tests := []struct {
		name   string
		send   func(c *h2Client)
		allow  int    // requests passed before the end
		reason string // "" for a clean end
		host   string
	}{
		{"allowed", func(c *h2Client) { c.request(1, false, get("ok.test")...) }, 1, "", ""},
		{"three on one connection", func(c *h2Client) {
			c.request(1, false, get("ok.test")...)
			c.request(3, true, get("ok.test:80")...)
			c.request(5, false, get("OK.test")...)
		}, 3, "", ""},
		{"fronted first", func(c *h2Client) { c.request(1, false, get("evil.test")...) }, 0, egress.ReasonHostMismatch, "evil.test"},
		{"fronted later", func(c *h2Client) {
			c.request(1, false, get("ok.test")...)
			c.request(3, false, get("evil.test")...)
		}, 1, egress.ReasonHostMismatch, "evil.test"},
		{"fronted in a continuation", func(c *h2Client) {
			c.request(1, false, get("ok.test")...)
			c.request(3, true, get("evil.test")...)
		}, 1, egress.ReasonHostMismatch, "evil.test"},
		{"host disagrees with :authority", func(c *h2Client) {
			c.request(1, false, append(get("ok.test"), "host", "evil.test")...)
		}, 0, egress.ReasonHostMismatch, "evil.test"},
		{"host alone", func(c *h2Client) {
			c.request(1, false, ":method", "GET", ":scheme", "http", ":path", "/", "host", "evil.test")
		}, 0, egress.ReasonHostMismatch, "evil.test"},
		{"no name", func(c *h2Client) { c.request(1, false, ":method", "GET", ":scheme", "http", ":path", "/") }, 0, egress.ReasonHostMismatch, ""},
		{"two authorities", func(c *h2Client) {
			c.request(1, false, ":method", "GET", ":authority", "ok.test", ":authority", "evil.test", ":path", "/")
		}, 0, egress.ReasonMalformed, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newH2Client(true)
			tt.send(c)
			g := NewGuard(&slowReader{c.buf.String()}, Config{Judge: judgeNames("ok.test"), Strict: true})
			passed, err := drain(g)
			if n := strings.Count(passed, "Host: evil.test"); n != tt.allow {
				t.Errorf("%d requests passed; want %d", n, tt.allow)
			}
			if !strings.HasPrefix(c.buf.String(), passed) {
				t.Error("passed bytes are not the client's")
			}
			var r *Refusal
			switch {
			case tt.reason == "" && err != nil:
				t.Errorf("ended with %v", err)
			case tt.reason != "" && (!errors.As(err, &r) || r.Verdict.Reason != tt.reason || r.Verdict.Host != tt.host || r.HTTP):
				t.Errorf("ended with %v; want %s %q", err, tt.reason, tt.host)
			}
		})
	}
}

// TestGuardH2CUpgrade: after an h2c upgrade request, the HTTP/2 that follows
// is checked like prior knowledge.
func TestGuardH2CUpgrade(t *testing.T) {
	up := "GET / HTTP/1.1\r\nHost: ok.test\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n"
	c := newH2Client(true)
	c.request(3, false, get("ok.test")...)
	ok := up + c.buf.String()
	c.request(5, false, get("evil.test")...)
	g := NewGuard(strings.NewReader(up+c.buf.String()), Config{Judge: judgeNames("ok.test"), Strict: true})
	passed, err := drain(g)
	var r *Refusal
	if passed != ok || !errors.As(err, &r) || r.Verdict.Host != "evil.test" {
		t.Errorf("passed %d of %d bytes, %v; want the upgrade and the first HTTP/2 request, then evil.test refused", len(passed), len(ok), err)
	}
	// A preface that is not one.
	g = NewGuard(strings.NewReader("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"), Config{Judge: judgeNames("ok.test"), Strict: true})
	if _, err := drain(g); !errors.As(err, &r) || r.Verdict.Reason != egress.ReasonMalformed {
		t.Errorf("bad preface: %v", err)
	}
}
