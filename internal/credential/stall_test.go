package credential

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestGatewayStalledBody checks that a request body that stops arriving
// is bounded in time: the endpoint answers 408 (note body_stalled) once
// no byte came for BodyIdleTimeout, and the host's request is abandoned.
func TestGatewayStalledBody(t *testing.T) {
	ca := newTestCA(t)
	gw := newTestGateway(t, upstreamTLS(t, ca, &recordingUpstream{}), ca, decls,
		func(c *GatewayConfig) { c.BodyIdleTimeout = 300 * time.Millisecond })
	c, err := net.Dial("tcp", strings.TrimPrefix(gw.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(20 * time.Second))
	io.WriteString(c, "POST /bear/upload/a HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\nonly a few bytes")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a stalled body: %v\n%s", err, gw.logs)
	}
	resp.Body.Close()
	if ev := gw.nextEvent(t); resp.StatusCode != http.StatusRequestTimeout || ev.Note != NoteBodyStalled {
		t.Errorf("stalled body: %d, event %+v; want 408 %s", resp.StatusCode, ev, NoteBodyStalled)
	}
}

// TestGatewayBodyIdleOnlyWhileReading checks that the bound is on the
// body alone: once it is read, an answer slower than BodyIdleTimeout
// comes back whole.
func TestGatewayBodyIdleOnlyWhileReading(t *testing.T) {
	ca := newTestCA(t)
	up := &recordingUpstream{release: make(chan struct{})}
	gw := newTestGateway(t, upstreamTLS(t, ca, up), ca, decls,
		func(c *GatewayConfig) { c.BodyIdleTimeout = 100 * time.Millisecond })
	time.AfterFunc(time.Second, func() { close(up.release) })
	resp, body := gw.raw(t, "POST", "/hdr/stream", "payload", "Content-Length: 7")
	if resp.StatusCode != 200 || body != "first;second" {
		t.Errorf("a slow answer after a body: %d %q; want 200 %q", resp.StatusCode, body, "first;second")
	}
}
