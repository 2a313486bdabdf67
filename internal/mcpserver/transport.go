package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// The stdio transport. It speaks what the SDK's IOTransport speaks (one
// JSON-RPC message per line) but checks every line before the SDK sees it,
// because the SDK ends the whole session on one malformed line. A line that
// is not JSON gets a parse error (-32700) and one that is not a JSON-RPC
// 2.0 message (a batch, "jsonrpc":"1.0", a method that is not a string) an
// invalid request (-32600), written here; the session goes on. It also
// answers a request sent before initialize with -32600 (the SDK answers it
// with code 0), sends nothing for a request the client cancelled (as the
// MCP specification asks), and caps the message of any error response, so
// that nothing the client sent is echoed back at length.

// Transport limits.
const (
	// maxLine is the longest line accepted, as the SDK's default.
	maxLine = mcp.DefaultMaxLineLength
	// maxErrorMessage caps an error response's message.
	maxErrorMessage = 2 << 10
)

// StdioTransport serves MCP over r and w.
type StdioTransport struct {
	Reader io.ReadCloser
	Writer io.Writer
	Logger *slog.Logger // nil: discard

	mu   sync.Mutex
	conn *lineConn // once connected
}

var _ mcp.Transport = (*StdioTransport)(nil)

// Connect starts reading lines.
func (t *StdioTransport) Connect(context.Context) (mcp.Connection, error) {
	log := t.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &lineConn{
		w: t.Writer, r: t.Reader, log: log,
		incoming: make(chan readResult), closed: make(chan struct{}),
		inflight: map[jsonrpc.ID]bool{}, cancelled: map[jsonrpc.ID]bool{},
	}
	t.mu.Lock()
	t.conn = c
	t.mu.Unlock()
	go c.readLoop()
	return c, nil
}

// shutdown answers every call in flight with codeShuttingDown; their
// responses, when the handlers return, are not sent.
func (t *StdioTransport) shutdown() {
	t.mu.Lock()
	c := t.conn
	t.mu.Unlock()
	if c == nil {
		return
	}
	c.mu.Lock()
	var ids []jsonrpc.ID
	for id := range c.inflight {
		if !c.cancelled[id] {
			c.cancelled[id] = true
			ids = append(ids, id)
		}
	}
	c.mu.Unlock()
	for _, id := range ids {
		raw, _ := json.Marshal(id.Raw())
		c.writeError(raw, codeShuttingDown, shutdownText)
	}
}

type readResult struct {
	msg jsonrpc.Message
	err error
}

// lineConn is one stdio session.
type lineConn struct {
	r        io.ReadCloser
	log      *slog.Logger
	incoming chan readResult
	closed   chan struct{}
	once     sync.Once

	wmu sync.Mutex // guards following
	w   io.Writer

	mu          sync.Mutex // guards following
	initialized bool       // an initialize request was let through
	initID      jsonrpc.ID
	inflight    map[jsonrpc.ID]bool // calls read and not yet answered
	cancelled   map[jsonrpc.ID]bool // of those, the ones the client cancelled
}

func (c *lineConn) SessionID() string { return "" }

// Read returns the next message that passed the checks.
func (c *lineConn) Read(ctx context.Context) (jsonrpc.Message, error) {
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-c.closed:
		return nil, io.EOF
	case r := <-c.incoming:
		return r.msg, r.err
	}
}

// Write sends msg, unless it answers a cancelled request.
func (c *lineConn) Write(ctx context.Context, msg jsonrpc.Message) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if resp, ok := msg.(*jsonrpc.Response); ok {
		if c.answered(resp) {
			c.log.Debug("not answering a cancelled request", "id", resp.ID.Raw())
			return nil
		}
		if resp.Error != nil {
			msg = capError(resp)
		}
	}
	b, err := jsonrpc.EncodeMessage(msg)
	if err != nil {
		return fmt.Errorf("encoding a message: %w", err)
	}
	return c.writeLine(b)
}

// Close stops reading; a Read waiting returns io.EOF.
func (c *lineConn) Close() error {
	var err error
	c.once.Do(func() {
		close(c.closed)
		err = c.r.Close()
	})
	return err
}

func (c *lineConn) writeLine(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := c.w.Write(append(b, '\n'))
	return err
}

// answered records that resp answers its request and reports whether the
// client cancelled that request (so nothing is to be sent). A failed
// initialize leaves the session uninitialised.
func (c *lineConn) answered(resp *jsonrpc.Response) (cancelled bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if resp.ID == c.initID && resp.Error != nil {
		c.initialized = false
	}
	cancelled = c.cancelled[resp.ID]
	delete(c.inflight, resp.ID)
	delete(c.cancelled, resp.ID)
	return cancelled
}

// readLoop reads lines until the reader fails, answering the bad ones and
// passing the others on.
func (c *lineConn) readLoop() {
	br := bufio.NewReaderSize(c.r, 64<<10)
	for {
		line, err := readLine(br, maxLine)
		if errors.Is(err, errLineTooLong) {
			c.reply(nil, jsonrpc.CodeInvalidRequest, fmt.Sprintf("invalid request: a message longer than %d MiB was discarded", maxLine>>20))
			continue
		}
		if len(bytes.TrimSpace(line)) > 0 {
			if msg := c.check(line); msg != nil && !c.deliver(readResult{msg: msg}) {
				return
			}
		}
		if err != nil {
			c.deliver(readResult{err: err})
			return
		}
	}
}

func (c *lineConn) deliver(r readResult) bool {
	select {
	case c.incoming <- r:
		return true
	case <-c.closed:
		return false
	}
}

// errLineTooLong: a line ran past the limit; the rest of it was discarded.
var errLineTooLong = errors.New("line too long")

// readLine reads one line (without its newline) of at most limit bytes.
// A longer one is read to its end and dropped, with errLineTooLong.
func readLine(br *bufio.Reader, limit int) ([]byte, error) {
	var line []byte
	tooLong := false
	for {
		chunk, err := br.ReadSlice('\n')
		if !tooLong {
			if len(line)+len(chunk) > limit+1 {
				tooLong, line = true, nil
			} else {
				line = append(line, chunk...)
			}
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			continue
		}
		if tooLong {
			if err != nil {
				return nil, err
			}
			return nil, errLineTooLong
		}
		return bytes.TrimSuffix(line, []byte("\n")), err
	}
}

// reply writes an error response for a line that never reached the SDK.
// id is the request's id when it could be read, else null.
func (c *lineConn) reply(id json.RawMessage, code int64, message string) {
	c.writeError(id, code, message)
	c.log.Warn("refused a message", "code", code, "why", message)
}

// writeError writes an error response; id null when nil.
func (c *lineConn) writeError(id json.RawMessage, code int64, message string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: message}})
	if err := c.writeLine(b); err != nil {
		c.log.Debug("writing an error response", "err", err)
	}
}

// capError shortens an error response's message (see shortText), keeping
// its code.
func capError(resp *jsonrpc.Response) *jsonrpc.Response {
	msg := resp.Error.Error()
	short := &jsonrpc.Error{Message: shortText(msg)}
	if short.Message == msg {
		return resp
	}
	var we *jsonrpc.Error
	if errors.As(resp.Error, &we) {
		short.Code, short.Data = we.Code, we.Data
	}
	return &jsonrpc.Response{ID: resp.ID, Result: resp.Result, Error: short}
}
