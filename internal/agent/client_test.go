package agent

import (
	"context"
	"errors"
	"io"
	"os"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// frame is one frame the test client received, with its arrival order.
type frame struct {
	m   *agentproto.Msg
	p   []byte
	seq int
}

// client is a small host side for tests: it sends frames and collects the
// replies per request ID.
type client struct {
	t   *testing.T
	w   io.Writer
	wmu sync.Mutex

	mu     sync.Mutex
	cond   *sync.Cond
	queues map[uint64][]frame
	seq    int
	err    error

	nextID   uint64
	serveErr chan error
	hello    agentproto.Hello
}

// startAgent serves opts over a fresh socket pair and returns a client that
// has already received the guest's Hello.
func startAgent(t *testing.T, opts Options) *client {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[0]), "guest")
	host := os.NewFile(uintptr(fds[1]), "host")
	if opts.Logger == nil && testing.Verbose() {
		opts.Logger = NewConsoleLogger(os.Stderr, true)
	}
	ctx, cancel := context.WithCancel(context.Background())
	serveErr := make(chan error, 1)
	go func() { serveErr <- Serve(ctx, guest, opts) }()
	c := newClient(t, host, host)
	c.serveErr = serveErr
	t.Cleanup(func() {
		host.Close()
		cancel()
		select {
		case <-serveErr:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after the connection closed")
		}
		guest.Close()
	})
	c.awaitHello()
	return c
}

func newClient(t *testing.T, r io.Reader, w io.Writer) *client {
	c := &client{t: t, w: w, queues: make(map[uint64][]frame), nextID: 100}
	c.cond = sync.NewCond(&c.mu)
	go c.readLoop(r)
	return c
}

func (c *client) awaitHello() {
	c.t.Helper()
	f := c.next(0, 5*time.Second)
	if f.m.Kind != agentproto.KindHello || f.m.Hello == nil {
		c.t.Fatalf("first frame: got %+v; want hello", f.m)
	}
	c.hello = *f.m.Hello
}

func (c *client) readLoop(r io.Reader) {
	for {
		m, p, err := agentproto.ReadFrame(r)
		c.mu.Lock()
		if err != nil {
			c.err = err
			c.cond.Broadcast()
			c.mu.Unlock()
			return
		}
		c.seq++
		c.queues[m.ID] = append(c.queues[m.ID], frame{m: m, p: p, seq: c.seq})
		c.cond.Broadcast()
		c.mu.Unlock()
	}
}

func (c *client) id() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	return c.nextID
}

func (c *client) send(m *agentproto.Msg, payload []byte) {
	c.t.Helper()
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := agentproto.WriteFrame(c.w, m, payload); err != nil {
		c.t.Fatalf("sending %s: %v", m.Kind, err)
	}
}

// tryNext returns the next frame for id, or ok=false on timeout or when the
// stream ended.
func (c *client) tryNext(id uint64, timeout time.Duration) (frame, bool) {
	deadline := time.Now().Add(timeout)
	timer := time.AfterFunc(timeout, func() {
		c.mu.Lock()
		c.cond.Broadcast()
		c.mu.Unlock()
	})
	defer timer.Stop()
	c.mu.Lock()
	defer c.mu.Unlock()
	for {
		if q := c.queues[id]; len(q) > 0 {
			c.queues[id] = q[1:]
			return q[0], true
		}
		if c.err != nil || !time.Now().Before(deadline) {
			return frame{}, false
		}
		c.cond.Wait()
	}
}

func (c *client) next(id uint64, timeout time.Duration) frame {
	c.t.Helper()
	f, ok := c.tryNext(id, timeout)
	if !ok {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		c.t.Fatalf("no frame for id %d within %s (stream error: %v)", id, timeout, err)
	}
	return f
}

// request sends one message and returns the first reply.
func (c *client) request(m *agentproto.Msg, payload []byte) *agentproto.Msg {
	c.t.Helper()
	if m.ID == 0 {
		m.ID = c.id()
	}
	c.send(m, payload)
	return c.next(m.ID, 10*time.Second).m
}

// execResult is everything one exec sent.
type execResult struct {
	stdout, stderr []byte
	done           *agentproto.ExecDone
	err            string // KindError instead of a run
	doneSeq        int
	chunks         []int // payload sizes of the output frames
}

func (r execResult) code() int {
	if r.done == nil || r.done.ExitCode == nil {
		return -1
	}
	return *r.done.ExitCode
}

// startExec sends an Exec and returns its ID.
func (c *client) startExec(e agentproto.Exec) uint64 {
	c.t.Helper()
	id := c.id()
	c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindExec, Exec: &e}, nil)
	return id
}

// wait collects an exec's frames until ExecDone or Error.
func (c *client) wait(id uint64, timeout time.Duration) execResult {
	c.t.Helper()
	var r execResult
	deadline := time.Now().Add(timeout)
	for {
		f := c.next(id, time.Until(deadline))
		switch f.m.Kind {
		case agentproto.KindOutput:
			r.chunks = append(r.chunks, len(f.p))
			switch f.m.Stream {
			case "stdout":
				r.stdout = append(r.stdout, f.p...)
			case "stderr":
				r.stderr = append(r.stderr, f.p...)
			default:
				c.t.Fatalf("output on stream %q", f.m.Stream)
			}
		case agentproto.KindExecDone:
			r.done, r.doneSeq = f.m.Done, f.seq
			return r
		case agentproto.KindError:
			r.err = f.m.Error
			return r
		case agentproto.KindStdinAck:
		default:
			c.t.Fatalf("unexpected %s frame for exec %d", f.m.Kind, id)
		}
	}
}

func (c *client) exec(e agentproto.Exec) execResult {
	c.t.Helper()
	return c.wait(c.startExec(e), 20*time.Second)
}

// serveResult waits for Serve to return.
func (c *client) serveResult(timeout time.Duration) error {
	c.t.Helper()
	select {
	case err := <-c.serveErr:
		c.serveErr <- err // for the cleanup
		return err
	case <-time.After(timeout):
		c.t.Fatalf("Serve did not return within %s", timeout)
		return errors.New("unreachable")
	}
}
