package qemu

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// maxQMPEvents bounds the events a QMPClient remembers; older ones are
// dropped first.
const maxQMPEvents = 256

// QMPError is an error reply from QEMU.
type QMPError struct {
	Command string
	Class   string
	Desc    string
}

func (e *QMPError) Error() string {
	return fmt.Sprintf("qmp %s: %s: %s", e.Command, e.Class, e.Desc)
}

// QMPEvent is one asynchronous QMP event.
type QMPEvent struct {
	Name string          `json:"event"`
	Data json.RawMessage `json:"data,omitempty"`
	// Time is when QEMU emitted it.
	Time time.Time `json:"-"`
}

// ErrQMPClosed is returned by calls on a QMP connection that has ended.
var ErrQMPClosed = errors.New("qmp connection closed")

// QMPClient speaks the QEMU Machine Protocol over one connection. Commands
// may be issued from several goroutines; replies are matched by id. Events
// are kept (the last [maxQMPEvents]) for [QMPClient.WaitEvent].
type QMPClient struct {
	conn io.ReadWriteCloser

	wmu sync.Mutex // serialises writes

	mu      sync.Mutex
	nextID  uint64
	pending map[string]chan qmpReply
	events  []QMPEvent
	evWake  chan struct{} // closed and replaced when an event arrives
	err     error         // why the read loop ended; nil while running
	done    chan struct{} // closed when the read loop ends

	Version string // QEMU version from the greeting ("7.2.22")
}

type qmpReply struct {
	ret json.RawMessage
	err error
}

// wire is every shape a QMP server sends, decoded at once.
type wire struct {
	QMP *struct {
		Version struct {
			QEMU struct {
				Major, Minor, Micro int
			} `json:"qemu"`
		} `json:"version"`
	} `json:"QMP"`
	Return    json.RawMessage `json:"return"`
	Error     *struct{ Class, Desc string }
	Event     string          `json:"event"`
	Data      json.RawMessage `json:"data"`
	Timestamp *struct {
		Seconds      int64 `json:"seconds"`
		Microseconds int64 `json:"microseconds"`
	} `json:"timestamp"`
	ID json.RawMessage `json:"id"`
}

// NewQMPClient reads the greeting on conn, negotiates capabilities and
// starts reading replies and events. ctx bounds the handshake; on failure
// conn is closed. The client owns conn from then on.
func NewQMPClient(ctx context.Context, conn io.ReadWriteCloser) (*QMPClient, error) {
	c := &QMPClient{
		conn:    conn,
		pending: make(map[string]chan qmpReply),
		evWake:  make(chan struct{}),
		done:    make(chan struct{}),
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	greeting := make(chan error, 1)
	go func() {
		line, err := br.ReadBytes('\n')
		if err != nil {
			greeting <- fmt.Errorf("qmp greeting: %w", err)
			return
		}
		var w wire
		if err := json.Unmarshal(line, &w); err != nil || w.QMP == nil {
			greeting <- fmt.Errorf("qmp greeting: unexpected %q", truncate(line, 200))
			return
		}
		v := w.QMP.Version.QEMU
		c.Version = fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Micro)
		greeting <- nil
	}()
	select {
	case err := <-greeting:
		if err != nil {
			conn.Close()
			return nil, err
		}
	case <-ctx.Done():
		conn.Close()
		<-greeting
		return nil, fmt.Errorf("qmp greeting: %w", ctx.Err())
	}
	go c.readLoop(br)
	if _, err := c.Execute(ctx, "qmp_capabilities", nil); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

func (c *QMPClient) readLoop(br *bufio.Reader) {
	var err error
	for {
		var line []byte
		line, err = br.ReadBytes('\n')
		if err != nil {
			break
		}
		var w wire
		if jerr := json.Unmarshal(line, &w); jerr != nil {
			err = fmt.Errorf("qmp: bad message %q: %w", truncate(line, 200), jerr)
			break
		}
		switch {
		case w.Event != "":
			ev := QMPEvent{Name: w.Event, Data: w.Data}
			if w.Timestamp != nil {
				ev.Time = time.Unix(w.Timestamp.Seconds, w.Timestamp.Microseconds*1000)
			}
			c.mu.Lock()
			if len(c.events) >= maxQMPEvents {
				c.events = append(c.events[:0], c.events[1:]...)
			}
			c.events = append(c.events, ev)
			close(c.evWake)
			c.evWake = make(chan struct{})
			c.mu.Unlock()
		case w.ID != nil:
			var id string
			if uerr := json.Unmarshal(w.ID, &id); uerr != nil {
				continue // not one of ours
			}
			c.mu.Lock()
			ch := c.pending[id]
			delete(c.pending, id)
			c.mu.Unlock()
			if ch == nil {
				continue // its caller gave up
			}
			r := qmpReply{ret: w.Return}
			if w.Error != nil {
				r.err = &QMPError{Class: w.Error.Class, Desc: w.Error.Desc}
			}
			ch <- r
		}
	}
	if errors.Is(err, io.EOF) {
		err = ErrQMPClosed
	} else {
		err = fmt.Errorf("%w: %v", ErrQMPClosed, err)
	}
	c.mu.Lock()
	c.err = err
	for id, ch := range c.pending {
		ch <- qmpReply{err: err}
		delete(c.pending, id)
	}
	close(c.done)
	c.mu.Unlock()
}

// Execute runs one command and returns its "return" value. args may be nil
// or anything that encodes as a JSON object. A QEMU error reply comes back as
// a *QMPError.
func (c *QMPClient) Execute(ctx context.Context, cmd string, args any) (json.RawMessage, error) {
	return c.execute(ctx, cmd, args, nil)
}

// ExecuteFile is Execute with f's descriptor passed along (SCM_RIGHTS), as
// getfd and add-fd expect. The connection must be a Unix socket.
func (c *QMPClient) ExecuteFile(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	if _, ok := c.conn.(*net.UnixConn); !ok {
		return nil, fmt.Errorf("qmp %s: passing a file needs a unix socket connection: %w", cmd, errdefs.ErrNotSupported)
	}
	return c.execute(ctx, cmd, args, f)
}

func (c *QMPClient) execute(ctx context.Context, cmd string, args any, f *os.File) (json.RawMessage, error) {
	c.mu.Lock()
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return nil, fmt.Errorf("qmp %s: %w", cmd, err)
	}
	c.nextID++
	id := "isopod-" + strconv.FormatUint(c.nextID, 10)
	ch := make(chan qmpReply, 1)
	c.pending[id] = ch
	c.mu.Unlock()

	req := struct {
		Execute   string `json:"execute"`
		Arguments any    `json:"arguments,omitempty"`
		ID        string `json:"id"`
	}{cmd, args, id}
	b, err := json.Marshal(req)
	if err != nil {
		c.forget(id)
		return nil, fmt.Errorf("qmp %s: encoding arguments: %w", cmd, err)
	}
	b = append(b, '\n')
	c.wmu.Lock()
	if f != nil {
		_, _, err = c.conn.(*net.UnixConn).WriteMsgUnix(b, unix.UnixRights(int(f.Fd())), nil)
		runtime.KeepAlive(f)
	} else {
		_, err = c.conn.Write(b)
	}
	c.wmu.Unlock()
	if err != nil {
		c.forget(id)
		return nil, fmt.Errorf("qmp %s: %w: %v", cmd, ErrQMPClosed, err)
	}
	select {
	case r := <-ch:
		if r.err != nil {
			var qe *QMPError
			if errors.As(r.err, &qe) {
				qe.Command = cmd
				return nil, qe
			}
			return nil, fmt.Errorf("qmp %s: %w", cmd, r.err)
		}
		return r.ret, nil
	case <-ctx.Done():
		c.forget(id)
		return nil, fmt.Errorf("qmp %s: %w: %w", cmd, errdefs.ErrUnavailable, ctx.Err())
	}
}

func (c *QMPClient) forget(id string) {
	c.mu.Lock()
	delete(c.pending, id)
	c.mu.Unlock()
}

// Events returns a copy of the events received so far (at most the last
// [maxQMPEvents]).
func (c *QMPClient) Events() []QMPEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]QMPEvent(nil), c.events...)
}

// ForgetEvents drops the remembered events called name, so that a wait
// that follows sees only those still to come.
func (c *QMPClient) ForgetEvents(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.events = slices.DeleteFunc(c.events, func(ev QMPEvent) bool { return ev.Name == name })
}

// WaitEvent returns the first remembered event called name, waiting for one
// to arrive if there is none yet.
func (c *QMPClient) WaitEvent(ctx context.Context, name string) (QMPEvent, error) {
	return c.WaitEventFunc(ctx, name, func(QMPEvent) bool { return true })
}

// WaitEventFunc returns the first remembered event called name for which
// match is true, waiting for one to arrive if there is none yet.
func (c *QMPClient) WaitEventFunc(ctx context.Context, name string, match func(QMPEvent) bool) (QMPEvent, error) {
	for {
		c.mu.Lock()
		for _, ev := range c.events {
			if ev.Name == name && match(ev) {
				c.mu.Unlock()
				return ev, nil
			}
		}
		wake, closed := c.evWake, c.err
		c.mu.Unlock()
		if closed != nil {
			return QMPEvent{}, fmt.Errorf("qmp waiting for %s: %w", name, closed)
		}
		select {
		case <-wake:
		case <-c.done:
		case <-ctx.Done():
			return QMPEvent{}, fmt.Errorf("qmp waiting for %s: %w: %w", name, errdefs.ErrUnavailable, ctx.Err())
		}
	}
}

// Done is closed when the connection has ended.
func (c *QMPClient) Done() <-chan struct{} { return c.done }

// Close ends the connection; pending commands fail with [ErrQMPClosed].
func (c *QMPClient) Close() error {
	err := c.conn.Close()
	<-c.done
	return err
}
