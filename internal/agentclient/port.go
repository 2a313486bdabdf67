package agentclient

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"isopod/internal/agentproto"
)

// ErrPortReset is a relayed stream that the guest side closed in both
// directions (its socket failed or was reset).
var ErrPortReset = errors.New("the guest closed the relayed connection")

// PortStream is a TCP connection to a guest port relayed over the agent
// channel: Read, Write, CloseWrite (a half-close) and Close. Reads and
// writes are windowed per stream, so a slow stream holds up only itself.
// Read and Write may be called from two goroutines.
type PortStream struct {
	c      *Client
	id     uint64
	q      *queue
	ctx    context.Context
	cancel context.CancelFunc

	data    chan []byte   // port_data payloads, in order; closed at EOF
	credits chan struct{} // the guest's acks
	cur     []byte        // the rest of the frame Read is in
	pending bool          // cur's frame is not acknowledged yet

	mu       sync.Mutex
	err      error // why the stream ended (io.EOF at a half-close)
	wclosed  bool
	shutdown bool
}

// OpenPort connects to 127.0.0.1:port in the guest through the agent.
func (c *Client) OpenPort(ctx context.Context, port int) (*PortStream, error) {
	id, q, err := c.register()
	if err != nil {
		return nil, err
	}
	if err := c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindPortOpen, Port: port}, nil); err != nil {
		c.unregister(id)
		return nil, err
	}
	f, err := c.recv(ctx, q)
	if err == nil && f.msg.Kind == agentproto.KindError {
		err = replyErr(fmt.Sprintf("guest port %d: ", port), f.msg)
	} else if err == nil && f.msg.Kind != agentproto.KindOK {
		err = fmt.Errorf("guest port %d: the guest answered %s", port, f.msg.Kind)
	}
	if err != nil {
		c.unregister(id)
		return nil, err
	}
	s := &PortStream{c: c, id: id, q: q, data: make(chan []byte, agentproto.PortWindow),
		credits: make(chan struct{}, agentproto.PortWindow)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for range agentproto.PortWindow {
		s.credits <- struct{}{}
	}
	go s.demux()
	return s, nil
}

// demux sorts the stream's frames: data for Read, acks for Write. Acks
// keep coming after the guest's half-close.
func (s *PortStream) demux() {
	eof := false
	defer func() {
		if !eof {
			close(s.data)
		}
	}()
	for {
		f, ok, err := s.q.pop(s.ctx)
		if err != nil || !ok {
			s.fail(ErrClosed)
			s.cancel()
			return
		}
		switch f.msg.Kind {
		case agentproto.KindPortData:
			if len(f.payload) == 0 || eof {
				continue
			}
			select {
			case s.data <- f.payload:
			default: // over the window: the guest broke the protocol
				s.fail(fmt.Errorf("guest port stream: more than %d unacknowledged frames", agentproto.PortWindow))
				s.cancel()
				return
			}
		case agentproto.KindPortAck:
			select {
			case s.credits <- struct{}{}:
			default:
			}
		case agentproto.KindPortClose:
			if !f.msg.EOF {
				s.fail(ErrPortReset)
				s.cancel()
				return
			}
			if !eof {
				eof = true
				s.fail(io.EOF)
				close(s.data)
			}
		}
	}
}

func (s *PortStream) fail(err error) {
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	s.mu.Unlock()
}

func (s *PortStream) ended() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

// Read reads what the guest side sent; io.EOF once it half-closed.
func (s *PortStream) Read(p []byte) (int, error) {
	if len(s.cur) == 0 {
		if s.pending {
			s.pending = false
			s.c.send(&agentproto.Msg{ID: s.id, Kind: agentproto.KindPortAck}, nil)
		}
		b, ok := <-s.data
		if !ok {
			if err := s.ended(); err != nil {
				return 0, err
			}
			return 0, ErrClosed
		}
		s.cur, s.pending = b, true
	}
	n := copy(p, s.cur)
	s.cur = s.cur[n:]
	return n, nil
}

// Write sends p to the guest side, waiting for window credits.
func (s *PortStream) Write(p []byte) (int, error) {
	s.mu.Lock()
	wclosed := s.wclosed
	s.mu.Unlock()
	if wclosed {
		return 0, fmt.Errorf("write after CloseWrite: %w", io.ErrClosedPipe)
	}
	n := 0
	for len(p) > 0 {
		select {
		case <-s.credits:
		case <-s.ctx.Done():
			if err := s.ended(); err != nil && err != io.EOF {
				return n, err
			}
			return n, ErrClosed
		}
		k := min(len(p), agentproto.ChunkSize)
		if err := s.c.send(&agentproto.Msg{ID: s.id, Kind: agentproto.KindPortData}, p[:k]); err != nil {
			return n, err
		}
		n += k
		p = p[k:]
	}
	return n, nil
}

// CloseWrite half-closes: the guest socket sees EOF; reading goes on.
func (s *PortStream) CloseWrite() error {
	s.mu.Lock()
	done := s.wclosed
	s.wclosed = true
	s.mu.Unlock()
	if done {
		return nil
	}
	return s.c.send(&agentproto.Msg{ID: s.id, Kind: agentproto.KindPortClose, EOF: true}, nil)
}

// Close ends the stream both ways.
func (s *PortStream) Close() error {
	s.mu.Lock()
	done := s.shutdown
	s.shutdown = true
	s.mu.Unlock()
	if done {
		return nil
	}
	err := s.c.send(&agentproto.Msg{ID: s.id, Kind: agentproto.KindPortClose}, nil)
	s.cancel()
	s.c.unregister(s.id)
	return err
}
