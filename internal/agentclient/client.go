// Package agentclient is the host side of the guest agent protocol
// (internal/agentproto): it multiplexes requests over one byte stream, checks
// the protocol version, streams exec output and stdin, copies files out and
// in, and makes a session's calls: background jobs and relayed guest ports.
package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// ErrClosed is returned for calls on a client whose stream has ended.
var ErrClosed = errors.New("agent connection closed")

// frame is one received frame.
type frame struct {
	msg     *agentproto.Msg
	payload []byte
}

// Client talks to one guest agent. It is safe for concurrent use; every
// method is bounded by its context.
type Client struct {
	conn io.ReadWriteCloser
	log  *slog.Logger

	wmu sync.Mutex // serialises frame writes

	mu      sync.Mutex // guards following
	nextID  uint64
	pending map[uint64]*queue
	hellos  []agentproto.Hello
	err     error // set once the reader stops

	helloCh chan struct{} // signalled on each unsolicited hello
	done    chan struct{} // closed when the reader stops
}

// New starts reading from conn. Close the client to stop.
func New(conn io.ReadWriteCloser, log *slog.Logger) *Client {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Client{
		conn:    conn,
		log:     log,
		pending: make(map[uint64]*queue),
		helloCh: make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	go c.readLoop()
	return c
}

// Close closes the stream; pending calls fail with ErrClosed.
func (c *Client) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}

// Done is closed when the stream has ended.
func (c *Client) Done() <-chan struct{} { return c.done }

func (c *Client) readLoop() {
	defer close(c.done)
	for {
		m, p, err := agentproto.ReadFrame(c.conn)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrClosedPipe) {
				err = ErrClosed
			} else {
				err = fmt.Errorf("%w: %w", ErrClosed, err)
			}
			c.mu.Lock()
			c.err = err
			for _, q := range c.pending {
				q.close()
			}
			c.mu.Unlock()
			return
		}
		if m.ID == 0 {
			if m.Kind == agentproto.KindHello && m.Hello != nil {
				c.mu.Lock()
				c.hellos = append(c.hellos, *m.Hello)
				c.mu.Unlock()
				select {
				case c.helloCh <- struct{}{}:
				default:
				}
			}
			continue
		}
		c.mu.Lock()
		q := c.pending[m.ID]
		c.mu.Unlock()
		if q == nil {
			c.log.Debug("agent frame for no request", "id", m.ID, "kind", m.Kind)
			continue
		}
		q.push(frame{m, p})
	}
}

// register allocates a request id and its receive queue.
func (c *Client) register() (uint64, *queue, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, nil, c.err
	}
	c.nextID++
	q := newQueue()
	c.pending[c.nextID] = q
	return c.nextID, q, nil
}

func (c *Client) unregister(id uint64) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

func (c *Client) send(m *agentproto.Msg, payload []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if err := agentproto.WriteFrame(c.conn, m, payload); err != nil {
		return fmt.Errorf("sending %s: %w", m.Kind, err)
	}
	return nil
}

// recv waits for the next frame of a request.
func (c *Client) recv(ctx context.Context, q *queue) (frame, error) {
	f, ok, err := q.pop(ctx)
	if err != nil {
		return frame{}, fmt.Errorf("waiting for the guest agent: %w: %w", errdefs.ErrUnavailable, err)
	}
	if !ok {
		c.mu.Lock()
		err := c.err
		c.mu.Unlock()
		if err == nil {
			err = ErrClosed
		}
		return frame{}, err
	}
	return f, nil
}

// checkVersion refuses a guest speaking another protocol.
func checkVersion(h agentproto.Hello) error {
	if h.Version != agentproto.Version {
		return fmt.Errorf("guest agent speaks protocol %d but this isopod speaks %d: rebuild the guest images with `isopod image build-all`: %w",
			h.Version, agentproto.Version, errdefs.ErrFailedPrecondition)
	}
	return nil
}

// WaitHello waits for the guest's unsolicited Hello after a cold boot and
// checks its protocol version.
func (c *Client) WaitHello(ctx context.Context) (agentproto.Hello, error) {
	for {
		c.mu.Lock()
		if len(c.hellos) > 0 {
			h := c.hellos[0]
			c.hellos = c.hellos[1:]
			c.mu.Unlock()
			return h, checkVersion(h)
		}
		err := c.err
		c.mu.Unlock()
		if err != nil {
			return agentproto.Hello{}, fmt.Errorf("guest agent went away before it was ready: %w", err)
		}
		select {
		case <-c.helloCh:
		case <-c.done:
		case <-ctx.Done():
			return agentproto.Hello{}, fmt.Errorf("waiting for the guest agent: %w: %w", errdefs.ErrUnavailable, ctx.Err())
		}
	}
}

// Hello performs the handshake explicitly (after a snapshot resume).
func (c *Client) Hello(ctx context.Context) (agentproto.Hello, error) {
	f, err := c.roundTrip(ctx, &agentproto.Msg{Kind: agentproto.KindHello, Hello: &agentproto.Hello{Version: agentproto.Version}}, nil)
	if err != nil {
		return agentproto.Hello{}, err
	}
	if f.msg.Hello == nil {
		return agentproto.Hello{}, fmt.Errorf("guest agent answered hello without a body")
	}
	h := *f.msg.Hello
	if err := c.skipIDs(h.LastID); err != nil {
		return h, err
	}
	return h, checkVersion(h)
}

// skipIDs makes the next request ids follow last, the highest id a
// restored guest has read from the host before this one (Hello.LastID).
func (c *Client) skipIDs(last uint64) error {
	if last > agentproto.MaxLastID {
		return fmt.Errorf("guest agent claims to have read request id %d, beyond any a host sends (%d): %w",
			last, uint64(agentproto.MaxLastID), errdefs.ErrFailedPrecondition)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID = max(c.nextID, last)
	return nil
}

// roundTrip sends one request and returns its single reply; a KindError
// reply becomes an error.
func (c *Client) roundTrip(ctx context.Context, m *agentproto.Msg, payload []byte) (frame, error) {
	id, q, err := c.register()
	if err != nil {
		return frame{}, err
	}
	defer c.unregister(id)
	m.ID = id
	if err := c.send(m, payload); err != nil {
		return frame{}, err
	}
	f, err := c.recv(ctx, q)
	if err != nil {
		return frame{}, fmt.Errorf("%s: %w", m.Kind, err)
	}
	if f.msg.Kind == agentproto.KindError {
		return frame{}, replyErr("guest: "+string(m.Kind)+": ", f.msg)
	}
	return f, nil
}

// Call sends a request that is answered by OK or Error: ping, configure_net,
// sync_clock, set_hostname, add_entropy, halt.
func (c *Client) Call(ctx context.Context, m *agentproto.Msg, payload []byte) error {
	_, err := c.roundTrip(ctx, m, payload)
	return err
}
