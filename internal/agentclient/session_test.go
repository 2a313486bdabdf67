package agentclient

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/agent"
	"isopod/internal/agentproto"
)

// cancelAfter yields n bytes a read and cancels its context at the
// second read.
type cancelAfter struct {
	reads  int
	cancel context.CancelFunc
}

func (r *cancelAfter) Read(p []byte) (int, error) {
	if r.reads++; r.reads == 2 {
		r.cancel()
	}
	return copy(p, bytes.Repeat([]byte("x"), len(p))), nil
}

// A copy-in whose context ends mid-way fails, and the guest removes its
// temporary file: nothing appears at the destination.
func TestPutFileCanceled(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	dir := t.TempDir()
	dest := filepath.Join(dir, "f")
	if _, err := c.PutFile(ctx, dest, 0, 0, &cancelAfter{cancel: cancel}); !errors.Is(err, context.Canceled) {
		t.Fatalf("PutFile: %v; want canceled", err)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("left in the directory: %v", ents)
	}
}

// A guest connection reset reaches the host's reader as ErrPortReset; a
// clean close as EOF after the data.
func TestPortStreamEnds(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	ctx := testCtx(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for i := 0; ; i++ {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if i == 0 {
				conn.Write([]byte("bye"))
				conn.Close()
				continue
			}
			io.ReadFull(conn, make([]byte, 1)) // the host wrote
			conn.(*net.TCPConn).SetLinger(0)
			conn.Close() // a reset
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	s, err := c.OpenPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := io.ReadAll(s); err != nil || string(got) != "bye" {
		t.Errorf("a clean close: %q, %v", got, err)
	}
	s.Close()
	s, err = c.OpenPort(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Write([]byte("x"))
	if _, err := io.ReadAll(s); !errors.Is(err, ErrPortReset) {
		t.Errorf("a reset: %v; want ErrPortReset", err)
	}
	if _, err := s.Write([]byte(strings.Repeat("y", agentproto.ChunkSize*(agentproto.PortWindow+1)))); err == nil {
		t.Errorf("writing more than a window to a reset stream succeeded")
	}
}
