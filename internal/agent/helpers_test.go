package agent

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// The tests drive Serve with the host's own client (internal/agentclient)
// over a socket pair. Protocol violations and requests the client never
// makes are written raw on the same connection, and every frame the agent
// sends is recorded, so that tests can look at what the client hides.

// frame is one frame as it crossed the wire.
type frame struct {
	m *agentproto.Msg
	p []byte
}

// wireTap is the host end of a test connection. The client reads and
// writes through it; it records every frame in both directions.
type wireTap struct {
	net.Conn

	wmu sync.Mutex // serialises writes: the client's frames and raw ones

	mu   sync.Mutex // guards following
	in   []byte     // received bytes not yet a whole frame
	got  []frame    // frames the agent sent, in order
	sent []*agentproto.Msg
	wake chan struct{} // signalled on every frame received
}

func newWireTap(c net.Conn) *wireTap { return &wireTap{Conn: c, wake: make(chan struct{}, 1)} }

func (w *wireTap) Read(p []byte) (int, error) {
	n, err := w.Conn.Read(p)
	if n > 0 {
		w.mu.Lock()
		w.in = append(w.in, p[:n]...)
		for len(w.in) >= 4 {
			size := 4 + int(binary.LittleEndian.Uint32(w.in))
			if len(w.in) < size {
				break
			}
			if m, payload, err := agentproto.ReadFrame(bytes.NewReader(w.in[:size])); err == nil {
				w.got = append(w.got, frame{m, payload})
			}
			w.in = w.in[size:]
		}
		w.mu.Unlock()
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
	return n, err
}

// Write passes one of the client's frames (agentproto.WriteFrame writes
// each with one call) and records its header.
func (w *wireTap) Write(p []byte) (int, error) {
	if m, _, err := agentproto.ReadFrame(bytes.NewReader(p)); err == nil {
		w.mu.Lock()
		w.sent = append(w.sent, m)
		w.mu.Unlock()
	}
	return w.writeRaw(p)
}

// writeRaw writes bytes that need not be a valid frame.
func (w *wireTap) writeRaw(p []byte) (int, error) {
	w.wmu.Lock()
	defer w.wmu.Unlock()
	return w.Conn.Write(p)
}

// frames returns the frames received so far for id.
func (w *wireTap) frames(id uint64) []frame {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []frame
	for _, f := range w.got {
		if f.m.ID == id {
			out = append(out, f)
		}
	}
	return out
}

// await waits for the first frame for id that match accepts.
func (w *wireTap) await(t *testing.T, id uint64, match func(frame) bool) frame {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		for _, f := range w.frames(id) {
			if match == nil || match(f) {
				return f
			}
		}
		select {
		case <-w.wake:
		case <-deadline:
			t.Fatalf("no matching frame for id %d within 10s (got %d frames for it)", id, len(w.frames(id)))
		}
	}
}

// lastSent waits until the client has sent a request of kind and returns
// the ID of the last one.
func (w *wireTap) lastSent(t *testing.T, kind agentproto.Kind) uint64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		w.mu.Lock()
		for i := len(w.sent) - 1; i >= 0; i-- {
			if w.sent[i].Kind == kind {
				id := w.sent[i].ID
				w.mu.Unlock()
				return id
			}
		}
		w.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatalf("the client sent no %s", kind)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// countSent is how many requests of kind the client has sent.
func (w *wireTap) countSent(kind agentproto.Kind) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := 0
	for _, m := range w.sent {
		if m.Kind == kind {
			n++
		}
	}
	return n
}

// testConn is a served agent and a client on the other end.
type testConn struct {
	*agentclient.Client
	t        *testing.T
	srv      *Server
	wire     *wireTap
	serveErr chan error
	hello    agentproto.Hello
	helloErr error // the client's verdict on the hello (a version check)
	rawID    uint64
}

// startAgent serves opts over a fresh socket pair and returns a client that
// has received the agent's Hello.
func startAgent(t *testing.T, opts Options) *testConn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[0]), "guest")
	hostFile := os.NewFile(uintptr(fds[1]), "host")
	host, err := net.FileConn(hostFile)
	hostFile.Close()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Logger == nil && testing.Verbose() {
		opts.Logger = NewConsoleLogger(os.Stderr, true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	srv := NewServer(opts)
	c := &testConn{t: t, srv: srv, wire: newWireTap(host), serveErr: make(chan error, 1), rawID: 1 << 40}
	t.Cleanup(srv.KillAll) // after the connection's end (cleanups run last first)
	go func() { c.serveErr <- srv.Serve(ctx, guest) }()
	c.Client = agentclient.New(c.wire, nil)
	t.Cleanup(func() {
		c.Close()
		cancel()
		select {
		case err := <-c.serveErr:
			c.serveErr <- err
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after the connection closed")
		}
		guest.Close()
	})
	hctx, hcancel := context.WithTimeout(ctx, 5*time.Second)
	defer hcancel()
	c.hello, c.helloErr = c.WaitHello(hctx)
	if c.helloErr != nil && !errors.Is(c.helloErr, errdefs.ErrFailedPrecondition) {
		t.Fatalf("WaitHello: %v", c.helloErr)
	}
	return c
}

func (c *testConn) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

// call sends a request answered by OK or an error.
func (c *testConn) call(m *agentproto.Msg, payload []byte) error {
	return c.Call(c.ctx(), m, payload)
}

// raw sends m with a fresh ID of its own, past the client, and returns the
// agent's first reply.
func (c *testConn) raw(m *agentproto.Msg, payload []byte) *agentproto.Msg {
	c.t.Helper()
	c.rawID++
	m.ID = c.rawID
	c.sendRaw(m, payload)
	return c.wire.await(c.t, m.ID, nil).m
}

// sendRaw writes one frame past the client.
func (c *testConn) sendRaw(m *agentproto.Msg, payload []byte) {
	c.t.Helper()
	var b bytes.Buffer
	if err := agentproto.WriteFrame(&b, m, payload); err != nil {
		c.t.Fatal(err)
	}
	if _, err := c.wire.writeRaw(b.Bytes()); err != nil {
		c.t.Fatalf("sending %s: %v", m.Kind, err)
	}
}

// execResult is everything one exec gave.
type execResult struct {
	stdout, stderr []byte
	done           *agentproto.ExecDone
	err            error
}

func (r execResult) code() int {
	if r.done == nil || r.done.ExitCode == nil {
		return -1
	}
	return *r.done.ExitCode
}

func (r execResult) signal() int {
	if r.done == nil || r.done.Signal == nil {
		return 0
	}
	return *r.done.Signal
}

// execWith runs one exec with the client.
func (c *testConn) execWith(e agentproto.Exec, stdin io.Reader, stdout io.Writer) execResult {
	var o, er bytes.Buffer
	var w io.Writer = &o
	if stdout != nil {
		w = io.MultiWriter(&o, stdout)
	}
	done, err := c.Exec(c.ctx(), agentclient.ExecRequest{Exec: e, Stdin: stdin, Stdout: w, Stderr: &er})
	return execResult{stdout: o.Bytes(), stderr: er.Bytes(), done: done, err: err}
}

// startExec runs e in the background and returns once its first output
// arrived; the result comes on the channel.
func (c *testConn) startExec(e agentproto.Exec) <-chan execResult {
	c.t.Helper()
	first := &firstWrite{ch: make(chan struct{})}
	res := make(chan execResult, 1)
	go func() { res <- c.execWith(e, nil, first) }()
	select {
	case <-first.ch:
	case r := <-res:
		c.t.Fatalf("exec %q ended before its first output: %+v, %v", e.Argv, r.done, r.err)
	case <-time.After(10 * time.Second):
		c.t.Fatalf("no output from exec %q", e.Argv)
	}
	return res
}

// firstWrite closes ch on the first write.
type firstWrite struct {
	once sync.Once
	ch   chan struct{}
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.once.Do(func() { close(w.ch) })
	return len(p), nil
}

func (c *testConn) exec(e agentproto.Exec) execResult {
	c.t.Helper()
	r := c.execWith(e, nil, nil)
	if r.err != nil {
		c.t.Fatalf("exec %q: %v", e.Argv, r.err)
	}
	return r
}

// serveResult waits for Serve to return.
func (c *testConn) serveResult(timeout time.Duration) error {
	c.t.Helper()
	select {
	case err := <-c.serveErr:
		c.serveErr <- err // for the cleanup
		return err
	case <-time.After(timeout):
		c.t.Fatalf("Serve did not return within %s", timeout)
		return nil
	}
}

// wantErr checks a call's result: nil when part is empty, else an error
// containing part.
func wantErr(t *testing.T, err error, part string) {
	t.Helper()
	switch {
	case part == "" && err != nil:
		t.Fatalf("call failed: %v", err)
	case part != "" && (err == nil || !strings.Contains(err.Error(), part)):
		t.Fatalf("call: %v; want an error containing %q", err, part)
	}
}
