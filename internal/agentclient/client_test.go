package agentclient

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agent"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm/vmmfake"
)

// These tests drive the real guest agent (internal/agent) as a plain
// process: it serves one end of a socket pair and runs host programs, with
// a recording System underneath.

// guestEnd is the agent's side of a test connection.
type guestEnd struct {
	conn     net.Conn
	serveErr chan error // Serve's result, once
}

// socketPair returns two connected unix stream sockets.
func socketPair(t testing.TB) (host, guest net.Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "agentclient-test")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	return conns[0], conns[1]
}

// startAgent serves opts on a fresh socket pair and returns a client on
// the host end. Everything is closed and Serve waited for in t.Cleanup.
func startAgent(t *testing.T, opts agent.Options) (*Client, *guestEnd) {
	t.Helper()
	host, guest := socketPair(t)
	if opts.System == nil {
		opts.System = vmmfake.NewSystem()
	}
	g := &guestEnd{conn: guest, serveErr: make(chan error, 1)}
	ctx, cancel := context.WithCancel(context.Background())
	go func() { g.serveErr <- agent.Serve(ctx, guest, opts) }()
	c := New(host, nil)
	t.Cleanup(func() {
		c.Close()
		cancel()
		guest.Close()
		select {
		case <-g.serveErr:
		case <-time.After(5 * time.Second):
			t.Error("the agent did not stop after the connection closed")
		}
	})
	return c, g
}

// ready starts an agent and waits for its hello.
func ready(t *testing.T, opts agent.Options) (*Client, *guestEnd) {
	t.Helper()
	c, g := startAgent(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.WaitHello(ctx); err != nil {
		t.Fatalf("WaitHello: %v", err)
	}
	return c, g
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestHello(t *testing.T) {
	ctx := testCtx(t)
	c, _ := startAgent(t, agent.Options{Hello: func() agentproto.Hello {
		return agentproto.Hello{BootError: "no base disk", Kernel: "6.1.0-test"}
	}})
	h, err := c.WaitHello(ctx)
	if err != nil {
		t.Fatalf("WaitHello: %v", err)
	}
	if h.Version != agentproto.Version || h.BootError != "no base disk" || h.Kernel != "6.1.0-test" {
		t.Errorf("guest hello %+v; want protocol %d and the guest's fields", h, agentproto.Version)
	}
	// An explicit hello, as after a resume, is answered; no second
	// unsolicited one arrives.
	if h, err := c.Hello(ctx); err != nil || h.Version != agentproto.Version {
		t.Errorf("Hello = %+v, %v; want the guest's hello", h, err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.WaitHello(short); !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("second WaitHello: %v; want a timeout", err)
	}
}

func TestHelloVersionMismatch(t *testing.T) {
	ctx := testCtx(t)
	c, _ := startAgent(t, agent.Options{Hello: func() agentproto.Hello {
		return agentproto.Hello{Version: agentproto.Version + 1}
	}})
	h, err := c.WaitHello(ctx)
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "image build-all") {
		t.Errorf("WaitHello from a newer guest: %v; want ErrFailedPrecondition with the rebuild hint", err)
	}
	if h.Version != agentproto.Version+1 {
		t.Errorf("hello %+v; want it returned with the error", h)
	}
	if _, err := c.Hello(ctx); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("Hello from a newer guest: %v; want ErrFailedPrecondition", err)
	}
}

func TestWaitHelloStreamEnds(t *testing.T) {
	host, guest := socketPair(t)
	c := New(host, nil)
	defer c.Close()
	guest.Close()
	_, err := c.WaitHello(testCtx(t))
	if !errors.Is(err, ErrClosed) || !strings.Contains(err.Error(), "went away") {
		t.Errorf("WaitHello on an ended stream: %v; want ErrClosed", err)
	}
	select {
	case <-c.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("Done not closed after the stream ended")
	}
	if err := c.Call(testCtx(t), &agentproto.Msg{Kind: agentproto.KindPing}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Call after the stream ended: %v; want ErrClosed", err)
	}
}

func TestCalls(t *testing.T) {
	ctx := testCtx(t)
	sys := vmmfake.NewSystem()
	c, _ := ready(t, agent.Options{System: sys})
	clock := time.Unix(1700000000, 42)
	nc := &agentproto.NetConfig{Address: "10.0.2.2/30", Gateway: "10.0.2.1", DNS: []string{"10.0.2.1"}}
	ok := []struct {
		name    string
		msg     agentproto.Msg
		payload []byte
	}{
		{"ping", agentproto.Msg{Kind: agentproto.KindPing}, nil},
		{"hostname", agentproto.Msg{Kind: agentproto.KindSetHostname, Hostname: "box"}, nil},
		{"clock", agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: clock.UnixNano()}}, nil},
		{"net", agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: nc}, nil},
		{"entropy", agentproto.Msg{Kind: agentproto.KindAddEntropy}, make([]byte, 64)},
	}
	for _, tt := range ok {
		t.Run(tt.name, func(t *testing.T) {
			if err := c.Call(ctx, &tt.msg, tt.payload); err != nil {
				t.Errorf("Call: %v", err)
			}
		})
	}
	if st := sys.State(); st.Hostname != "box" || !st.Clock.Equal(clock) || st.Net == nil || st.Net.Address != nc.Address || st.EntropyBytes != 64 {
		t.Errorf("system saw hostname %q clock %v net %+v entropy %d; want what was sent", st.Hostname, st.Clock, st.Net, st.EntropyBytes)
	}

	bad := []struct {
		name string
		msg  agentproto.Msg
		want string
	}{
		{"unknown kind", agentproto.Msg{Kind: "bogus"}, `guest: bogus: unknown message kind "bogus"`},
		{"empty hostname", agentproto.Msg{Kind: agentproto.KindSetHostname}, "guest: set_hostname: set_hostname: hostname is empty"},
		{"bad net", agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: &agentproto.NetConfig{Address: "nope"}}, "IPv4 CIDR"},
		{"no entropy", agentproto.Msg{Kind: agentproto.KindAddEntropy}, "payload is empty"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			err := c.Call(ctx, &tt.msg, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Call: %v; want an error containing %q", err, tt.want)
			}
		})
	}
}

func TestHaltEndsStream(t *testing.T) {
	ctx := testCtx(t)
	sys := vmmfake.NewSystem()
	c, g := ready(t, agent.Options{System: sys})
	if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil); err != nil {
		t.Fatalf("halt: %v", err)
	}
	select {
	case err := <-g.serveErr:
		g.serveErr <- err
		if err != nil {
			t.Errorf("Serve after halt: %v; want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the agent kept serving after halt")
	}
	if n := sys.State().Syncs; n != 1 {
		t.Errorf("disks synced %d times; want 1", n)
	}
}

// The stream ending under pending requests fails each of them with
// ErrClosed, and every later call at once.
func TestStreamEndsMidRequest(t *testing.T) {
	ctx := testCtx(t)
	c, g := ready(t, agent.Options{})
	errs := make(chan error, 2)
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Exec: agentproto.Exec{Argv: []string{"sleep", "30"}, Cwd: "/"}})
		errs <- err
	}()
	stdin, feed := io.Pipe()
	defer feed.Close()
	go func() {
		_, err := c.Exec(ctx, ExecRequest{Exec: agentproto.Exec{Argv: []string{"cat"}, Cwd: "/"}, Stdin: stdin})
		errs <- err
	}()
	time.Sleep(200 * time.Millisecond)
	g.conn.Close()
	for range 2 {
		select {
		case err := <-errs:
			if !errors.Is(err, ErrClosed) {
				t.Errorf("request pending when the stream ended: %v; want ErrClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("a pending request did not fail when the stream ended")
		}
	}
	start := time.Now()
	if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindPing}, nil); !errors.Is(err, ErrClosed) {
		t.Errorf("Call after the end: %v; want ErrClosed", err)
	}
	if _, err := c.Exec(ctx, ExecRequest{Exec: agentproto.Exec{Argv: []string{"true"}}}); !errors.Is(err, ErrClosed) {
		t.Errorf("Exec after the end: %v; want ErrClosed", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("calls on an ended stream took %v; want them refused at once", d)
	}
}

// Close releases calls that wait for the guest.
func TestCloseReleasesCalls(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	res := make(chan error, 1)
	go func() {
		_, err := c.Exec(context.Background(), ExecRequest{Exec: agentproto.Exec{Argv: []string{"sleep", "30"}, Cwd: "/"}})
		res <- err
	}()
	time.Sleep(100 * time.Millisecond)
	c.Close()
	select {
	case err := <-res:
		if !errors.Is(err, ErrClosed) {
			t.Errorf("exec at Close: %v; want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not release the exec")
	}
}

// A call whose context ends gives up with ErrUnavailable and the context's
// error; the connection stays usable.
func TestCallContext(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := c.Exec(ctx, ExecRequest{Exec: agentproto.Exec{Argv: []string{"sleep", "30"}, Cwd: "/"}})
	if !errors.Is(err, errdefs.ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("exec past its context: %v; want ErrUnavailable and DeadlineExceeded", err)
	}
	if err := c.Call(testCtx(t), &agentproto.Msg{Kind: agentproto.KindPing}, nil); err != nil {
		t.Errorf("ping after a call gave up: %v", err)
	}
}

// A guest resumed from a snapshot may hold requests of the host before
// under their ids: Hello's LastID makes this client number above them,
// and a LastID that would leave no ids is refused.
func TestHelloSkipsTheGuestsIDs(t *testing.T) {
	for _, tt := range []struct {
		name    string
		last    uint64
		wantErr error
		wantID  uint64 // of the request after the hello
	}{
		{"none read", 0, nil, 2},
		{"an earlier host's", 40, nil, 41},
		{"the most a host sends", agentproto.MaxLastID, nil, agentproto.MaxLastID + 1},
		{"beyond any host", agentproto.MaxLastID + 1, errdefs.ErrFailedPrecondition, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			host, guest := socketPair(t)
			c := New(host, nil)
			t.Cleanup(func() { c.Close(); guest.Close() })
			ids := make(chan uint64, 2)
			go func() {
				for {
					m, _, err := agentproto.ReadFrame(guest)
					if err != nil {
						return
					}
					ids <- m.ID
					r := &agentproto.Msg{ID: m.ID, Kind: agentproto.KindOK}
					if m.Kind == agentproto.KindHello {
						r = &agentproto.Msg{ID: m.ID, Kind: agentproto.KindHello, Hello: &agentproto.Hello{Version: agentproto.Version, LastID: tt.last}}
					}
					agentproto.WriteFrame(guest, r, nil)
				}
			}()
			ctx := testCtx(t)
			_, err := c.Hello(ctx)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Hello with LastID %d: %v; want %v", tt.last, err, tt.wantErr)
			}
			if <-ids != 1 || err != nil {
				return
			}
			if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindPing}, nil); err != nil {
				t.Fatalf("Call after the hello: %v", err)
			}
			if got := <-ids; got != tt.wantID {
				t.Errorf("the request after the hello has id %d; want %d", got, tt.wantID)
			}
		})
	}
}
