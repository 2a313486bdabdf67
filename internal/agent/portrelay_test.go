package agent

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// listen serves each connection on a fresh loopback port with handle.
func listen(t *testing.T, handle func(net.Conn)) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				handle(c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// echoAll reads everything, then writes it back and closes.
func echoAll(c net.Conn) {
	b, _ := io.ReadAll(c)
	c.Write(b)
}

// A relayed stream carries bytes both ways intact, half-closes included,
// more than a window's worth of them.
func TestPortRelay(t *testing.T) {
	c := startAgent(t, Options{})
	port := listen(t, echoAll)
	s, err := c.OpenPort(c.ctx(), port)
	if err != nil {
		t.Fatalf("OpenPort: %v", err)
	}
	defer s.Close()
	data := make([]byte, 3*agentproto.PortWindow*agentproto.ChunkSize+77)
	rand.Read(data)
	go func() {
		s.Write(data)
		s.CloseWrite()
	}()
	got, err := io.ReadAll(s)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("echo: %d bytes, %v; want the %d sent", len(got), err, len(data))
	}
}

// A guest port nobody listens on is refused as unavailable; a bad port
// number as invalid.
func TestPortRelayRefused(t *testing.T) {
	c := startAgent(t, Options{})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if _, err := c.OpenPort(c.ctx(), port); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Errorf("a closed port: %v; want unavailable", err)
	}
	if _, err := c.OpenPort(c.ctx(), 70000); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("port 70000: %v; want invalid argument", err)
	}
}

// A stream whose guest side never reads fills its own window only: other
// streams and requests go on.
func TestPortRelaySlowStreamBlocksOnlyItself(t *testing.T) {
	c := startAgent(t, Options{})
	stuck := make(chan struct{})
	t.Cleanup(func() { close(stuck) })
	slow := listen(t, func(net.Conn) { <-stuck })
	a, err := c.OpenPort(c.ctx(), slow)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	wrote := make(chan struct{})
	go func() {
		defer close(wrote)
		a.Write(make([]byte, 32<<20)) // far more than the socket buffers and the window
	}()
	select {
	case <-wrote:
		t.Fatal("32 MiB went to a guest program that reads nothing")
	case <-time.After(300 * time.Millisecond):
	}
	b, err := c.OpenPort(c.ctx(), listen(t, echoAll))
	if err != nil {
		t.Fatalf("a second stream: %v", err)
	}
	defer b.Close()
	b.Write([]byte("ping"))
	b.CloseWrite()
	if got, err := io.ReadAll(b); err != nil || string(got) != "ping" {
		t.Errorf("the second stream: %q, %v", got, err)
	}
	if r := c.exec(agentproto.Exec{Argv: []string{"echo", "ok"}}); string(r.stdout) != "ok\n" {
		t.Errorf("an exec beside the stuck stream: %q", r.stdout)
	}
}
