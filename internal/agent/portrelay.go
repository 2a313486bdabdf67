package agent

import (
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A port relay (KindPortOpen) joins a host connection to a TCP connection
// to 127.0.0.1:PORT in the guest. Each direction is windowed: the guest
// sends a port_data frame only with a credit, which the host's port_ack
// returns, and acknowledges the host's frames once written to the socket.

// portDialTimeout bounds the guest's connect to its own port.
const portDialTimeout = 5 * time.Second

// errPortWindow is a host that sent more port_data frames than the window
// allows: the connection ends.
var errPortWindow = errors.New("port relay window overrun")

// portFrame is one host frame for a relayed stream.
type portFrame struct {
	data       []byte
	eof, close bool
}

// portRelay is one relayed stream.
type portRelay struct {
	id      uint64
	in      chan portFrame // the host's data, half-close and close
	credits chan struct{}  // the host's acks
	once    sync.Once
	closed  chan struct{} // closed when the stream is over
}

func (r *portRelay) end() { r.once.Do(func() { close(r.closed) }) }

// startPort registers the stream before returning, so that the frames
// that follow find it, and connects in a handler.
func (c *conn) startPort(m *agentproto.Msg) {
	if m.Port <= 0 || m.Port > 65535 {
		go c.replyErr(m.ID, fmt.Errorf("port_open: port %d is outside 1..65535: %w", m.Port, errdefs.ErrInvalidArgument))
		return
	}
	r := &portRelay{id: m.ID, in: make(chan portFrame, 2*agentproto.PortWindow),
		credits: make(chan struct{}, agentproto.PortWindow), closed: make(chan struct{})}
	for range agentproto.PortWindow {
		r.credits <- struct{}{}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.ports[m.ID]; dup {
		go c.replyErr(m.ID, fmt.Errorf("port_open: id %d is already in use; use a fresh id: %w", m.ID, errdefs.ErrInvalidArgument))
		return
	}
	c.ports[m.ID] = r
	if !c.spawnLocked(func() {
		c.runPort(r, m.Port)
		c.mu.Lock()
		delete(c.ports, r.id)
		c.mu.Unlock()
	}) {
		delete(c.ports, m.ID)
	}
}

// routePort hands a host frame to its stream without blocking; frames of a
// stream that is over are dropped.
func (c *conn) routePort(m *agentproto.Msg, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ports[m.ID]
	if r == nil {
		return nil
	}
	if m.Kind == agentproto.KindPortAck {
		select {
		case r.credits <- struct{}{}:
		default: // more acks than frames sent: ignored
		}
		return nil
	}
	f := portFrame{data: payload, eof: m.Kind == agentproto.KindPortClose && m.EOF, close: m.Kind == agentproto.KindPortClose && !m.EOF}
	select {
	case r.in <- f:
		return nil
	default:
		return fmt.Errorf("port relay %d: more than %d unacknowledged frames (the window is %d): %w", m.ID, cap(r.in), agentproto.PortWindow, errPortWindow)
	}
}

// runPort connects to the guest port and relays until the stream is over
// both ways, closed by either side, or the connection ends.
func (c *conn) runPort(r *portRelay, port int) {
	d := net.Dialer{Timeout: portDialTimeout}
	sock, err := d.DialContext(c.ctx, "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		c.replyErr(r.id, fmt.Errorf("port_open: connecting to guest port %d: %s: %w", port, errnoText(err), errdefs.ErrUnavailable))
		return
	}
	defer sock.Close()
	go func() {
		// A write blocked on a guest program that does not read ends
		// with the stream or the connection.
		select {
		case <-c.ctx.Done():
		case <-r.closed:
		}
		sock.Close()
	}()
	c.replyOK(r.id)
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		c.portToHost(r, sock)
	}()
	hostEOF := false
	for {
		select {
		case f := <-r.in:
			switch {
			case f.close:
				r.end()
			case f.eof:
				hostEOF = true
				if tc, ok := sock.(*net.TCPConn); ok {
					tc.CloseWrite()
				}
			default:
				if _, err := sock.Write(f.data); err != nil {
					c.reply(&agentproto.Msg{ID: r.id, Kind: agentproto.KindPortClose}, nil)
					r.end()
					continue
				}
				c.reply(&agentproto.Msg{ID: r.id, Kind: agentproto.KindPortAck}, nil)
			}
		case <-readDone:
			readDone = nil
		case <-r.closed:
		case <-c.ctx.Done():
			r.end()
		}
		if r.isOver() || (hostEOF && readDone == nil) {
			r.end()
			sock.Close() // releases portToHost
			if readDone != nil {
				<-readDone
			}
			return
		}
	}
}

func (r *portRelay) isOver() bool {
	select {
	case <-r.closed:
		return true
	default:
		return false
	}
}

// portToHost sends what the guest socket yields, one credit a frame, then
// a half-close at its EOF or a close when it fails.
func (c *conn) portToHost(r *portRelay, sock net.Conn) {
	buf := make([]byte, agentproto.ChunkSize)
	for {
		n, err := sock.Read(buf)
		if n > 0 {
			select {
			case <-r.credits:
			case <-r.closed:
				return
			}
			c.reply(&agentproto.Msg{ID: r.id, Kind: agentproto.KindPortData}, buf[:n])
		}
		if err != nil {
			if r.isOver() {
				return
			}
			m := &agentproto.Msg{ID: r.id, Kind: agentproto.KindPortClose, EOF: errors.Is(err, io.EOF)}
			c.reply(m, nil)
			if !m.EOF {
				r.end()
			}
			return
		}
	}
}
