package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// fakeQMP is the server end of a socketpair speaking QMP's wire format.
type fakeQMP struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

func newFakeQMP(t *testing.T) (*fakeQMP, net.Conn) {
	t.Helper()
	client, serverFile, err := socketpair()
	if err != nil {
		t.Fatal(err)
	}
	server, err := net.FileConn(serverFile)
	serverFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close(); client.Close() })
	return &fakeQMP{t: t, conn: server, r: bufio.NewReader(server)}, client
}

func (f *fakeQMP) send(line string) {
	if _, err := f.conn.Write([]byte(line + "\r\n")); err != nil {
		f.t.Errorf("fake qmp send: %v", err)
	}
}

// recv reads one request: its command, arguments and id.
func (f *fakeQMP) recv() (cmd string, args map[string]any, id json.RawMessage) {
	line, err := f.r.ReadBytes('\n')
	if err != nil {
		f.t.Errorf("fake qmp recv: %v", err)
		return "", nil, nil
	}
	var req struct {
		Execute   string          `json:"execute"`
		Arguments map[string]any  `json:"arguments"`
		ID        json.RawMessage `json:"id"`
	}
	if err := json.Unmarshal(line, &req); err != nil {
		f.t.Errorf("fake qmp: bad request %q: %v", line, err)
	}
	return req.Execute, req.Arguments, req.ID
}

const greeting = `{"QMP": {"version": {"qemu": {"micro": 22, "minor": 2, "major": 7}, "package": "Debian"}, "capabilities": ["oob"]}}`

// handshake serves the greeting and qmp_capabilities.
func (f *fakeQMP) handshake() {
	f.send(greeting)
	cmd, _, id := f.recv()
	if cmd != "qmp_capabilities" {
		f.t.Errorf("first command %q; want qmp_capabilities", cmd)
	}
	f.send(`{"return": {}, "id": ` + string(id) + `}`)
}

func TestQMPClient(t *testing.T) {
	srv, conn := newFakeQMP(t)
	served := make(chan struct{})
	first := make(chan struct{}) // the server has read the first request
	go func() {
		defer close(served)
		srv.handshake()

		// Two requests in flight, answered in reverse order with an event
		// and an unrelated reply in between.
		cmd1, args1, id1 := srv.recv()
		close(first)
		cmd2, _, id2 := srv.recv()
		if cmd1 != "query-status" || cmd2 != "migrate" || args1 != nil {
			t.Errorf("got %q %v, %q", cmd1, args1, cmd2)
		}
		srv.send(`{"timestamp": {"seconds": 1700000000, "microseconds": 5}, "event": "STOP"}`)
		srv.send(`{"return": {}, "id": "not-ours"}`)
		srv.send(`{"error": {"class": "GenericError", "desc": "no migration uri"}, "id": ` + string(id2) + `}`)
		srv.send(`{"return": {"status": "paused", "running": false}, "id": ` + string(id1) + `}`)

		cmd3, args3, id3 := srv.recv()
		if cmd3 != "human-monitor-command" || args3["command-line"] != "info status" {
			t.Errorf("got %q %v", cmd3, args3)
		}
		srv.send(`{"return": "VM status: paused\r\n", "id": ` + string(id3) + `}`)
		srv.send(`{"timestamp": {"seconds": 1700000001, "microseconds": 0}, "event": "SHUTDOWN", "data": {"guest": true, "reason": "guest-shutdown"}}`)
	}()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := NewQMPClient(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Version != "7.2.22" {
		t.Errorf("Version %q; want 7.2.22", c.Version)
	}

	type result struct {
		ret json.RawMessage
		err error
	}
	r1 := make(chan result, 1)
	go func() {
		ret, err := c.Execute(ctx, "query-status", nil)
		r1 <- result{ret, err}
	}()
	select { // query-status is written first
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("query-status never reached the server")
	}
	_, err = c.Execute(ctx, "migrate", map[string]string{})
	var qe *QMPError
	if !errors.As(err, &qe) || qe.Class != "GenericError" || qe.Desc != "no migration uri" || qe.Command != "migrate" {
		t.Errorf("migrate: got %v; want a GenericError QMPError", err)
	}
	got := <-r1
	var st struct{ Status string }
	if got.err != nil || json.Unmarshal(got.ret, &st) != nil || st.Status != "paused" {
		t.Errorf("query-status: %s, %v", got.ret, got.err)
	}
	ev, err := c.WaitEvent(ctx, "STOP")
	if err != nil || ev.Time.Unix() != 1700000000 {
		t.Errorf("STOP event: %+v, %v", ev, err)
	}

	ret, err := c.Execute(ctx, "human-monitor-command", map[string]string{"command-line": "info status"})
	var s string
	if err != nil || json.Unmarshal(ret, &s) != nil || s != "VM status: paused\r\n" {
		t.Errorf("hmp: %s, %v", ret, err)
	}
	ev, err = c.WaitEvent(ctx, "SHUTDOWN")
	if err != nil || string(ev.Data) == "" {
		t.Errorf("SHUTDOWN event: %+v, %v", ev, err)
	}
	if n := len(c.Events()); n != 2 {
		t.Errorf("%d events remembered; want 2", n)
	}
	// A wait after ForgetEvents sees only what comes next (a migration
	// after a restore's incoming one).
	c.ForgetEvents("STOP")
	if evs := c.Events(); len(evs) != 1 || evs[0].Name != "SHUTDOWN" {
		t.Errorf("events after forgetting STOP: %+v; want SHUTDOWN alone", evs)
	}
	<-served

	// The server goes away: pending and later calls fail, waits end.
	srv.conn.Close()
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("client did not notice the closed connection")
	}
	if _, err := c.Execute(ctx, "query-status", nil); !errors.Is(err, ErrQMPClosed) {
		t.Errorf("Execute after close: %v; want ErrQMPClosed", err)
	}
	if _, err := c.WaitEvent(ctx, "RESUME"); !errors.Is(err, ErrQMPClosed) {
		t.Errorf("WaitEvent after close: %v; want ErrQMPClosed", err)
	}
}

func TestQMPClientTimeouts(t *testing.T) {
	t.Run("no greeting", func(t *testing.T) {
		_, conn := newFakeQMP(t)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := NewQMPClient(ctx, conn); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v; want deadline exceeded", err)
		}
	})
	t.Run("bad greeting", func(t *testing.T) {
		srv, conn := newFakeQMP(t)
		go srv.send(`{"hello": 1}`)
		if _, err := NewQMPClient(context.Background(), conn); err == nil {
			t.Error("accepted a bad greeting")
		}
	})
	t.Run("no reply", func(t *testing.T) {
		srv, conn := newFakeQMP(t)
		go srv.handshake()
		c, err := NewQMPClient(context.Background(), conn)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := c.Execute(ctx, "stop", nil); !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("got %v; want unavailable and deadline exceeded", err)
		}
		if _, err := c.WaitEvent(ctx, "STOP"); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("WaitEvent: %v; want deadline exceeded", err)
		}
	})
	t.Run("eof before greeting", func(t *testing.T) {
		srv, conn := newFakeQMP(t)
		srv.conn.Close()
		if _, err := NewQMPClient(context.Background(), conn); err == nil {
			t.Error("no error on EOF")
		}
	})
}
