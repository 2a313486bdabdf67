package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
)

// Call streams. Over HTTP the SDK answers each call on the POST's own
// response, as a stream of server-sent events: its notifications, then its
// response. The gate runs the SDK's handler on a recorder rather than on
// the client's connection, and copies what it records to the client: so a
// call outlives a dropped connection, and a client that comes back with a
// GET carrying the Last-Event-ID it last saw gets the rest of the stream,
// the response included (the 2025-03-26 to 2025-11-25 transports' stream
// resumption). Every event carries an id, "<stream>_<n>"; under 2025-11-25
// a stream opens with an event that carries only an id, so that a client
// can resume one that dropped before anything else was sent.
//
// A finished stream is kept for resumeKeep, all of them within
// resumeBudget bytes (the oldest finished go first when it is full); a
// running call keeps only its last maxKeptNotices notifications. Under the
// 2026-07-28 protocol, which has no resumption, a call still ends with its
// request, and nothing is kept.

const (
	// resumeKeep is how long a finished call's stream can be resumed.
	resumeKeep = 15 * time.Minute
	// resumeBudget bounds the bytes all kept streams hold together.
	resumeBudget = 128 << 20
	// maxKeptNotices is how many of a call's notifications are kept for a
	// client that resumes; older ones are dropped.
	maxKeptNotices = 64
	// streamOverhead is what a stream costs beyond its events, counted
	// against resumeBudget.
	streamOverhead = 512
	// protocolPrimed is the oldest protocol version whose streams open
	// with an event that carries only an id.
	protocolPrimed = "2025-11-25"
	// protocolStateless is the first protocol version without resumption.
	protocolStateless = "2026-07-28"
)

// callStream is one call's response as the SDK wrote it.
type callStream struct {
	id        string
	principal string
	reqID     json.RawMessage
	resumable bool // kept for Last-Event-ID once it ends
	prime     bool // opens with an event that carries only an id
	store     *streamStore
	size      atomic.Int64

	mu       sync.Mutex // guards following
	head     *streamHead
	events   [][]byte // events[i] is event i+1; nil: dropped
	notices  []int    // indices into events of the notifications kept
	body     []byte   // a reply that is not an event stream
	started  bool     // the SDK took the call: it answers with an event stream
	answered bool     // the response (or the shutdown error) is in events
	dropped  bool     // cancelled by the client: no response is sent
	finished bool     // the SDK is done with the call
	change   chan struct{}
}

// streamHead is the status and header the SDK answered with.
type streamHead struct {
	code   int
	header http.Header
	sse    bool
}

// wake tells followers that the stream changed. cs.mu must be held.
func (cs *callStream) wake() {
	close(cs.change)
	cs.change = make(chan struct{})
}

func (cs *callStream) grow(n int) {
	cs.size.Add(int64(n))
	cs.store.bytes.Add(int64(n))
}

// start records that the SDK took the call.
func (cs *callStream) start() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.started = true
	cs.wake()
}

func (cs *callStream) setHead(h *streamHead) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.head = h
	cs.wake()
}

func (cs *callStream) addBody(p []byte) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.body = append(cs.body, p...)
	cs.grow(len(p))
}

// addEvent records one message the SDK sent: nothing once the call is
// answered, and no response to a call the client cancelled. An error
// response's message is cut to a short head.
func (cs *callStream) addEvent(data []byte) {
	msg, err := jsonrpc.DecodeMessage(data)
	resp, isResp := msg.(*jsonrpc.Response)
	if err == nil && isResp && resp.Error != nil {
		if b, err := jsonrpc.EncodeMessage(capError(resp)); err == nil {
			data = b
		}
	}
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.answered || (isResp && cs.dropped) {
		return
	}
	cs.push(bytes.Clone(data), !isResp)
	cs.answered = isResp
}

// push appends an event. cs.mu must be held.
func (cs *callStream) push(data []byte, notice bool) {
	cs.events = append(cs.events, data)
	cs.grow(len(data))
	if notice {
		cs.notices = append(cs.notices, len(cs.events)-1)
		if len(cs.notices) > maxKeptNotices {
			old := cs.notices[0]
			cs.grow(-len(cs.events[old]))
			cs.events[old] = nil
			cs.notices = cs.notices[1:]
		}
	}
	cs.wake()
}

// drop makes the stream send no response: the client cancelled the call.
func (cs *callStream) drop() {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	cs.dropped = true
}

// abort answers the call with a JSON-RPC error, unless it was answered or
// cancelled; whatever the SDK sends later is not sent.
func (cs *callStream) abort(code int64, message string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.answered || cs.dropped || cs.finished {
		return
	}
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", cs.reqID, jsonrpc.Error{Code: code, Message: message}})
	cs.push(b, false)
	cs.answered = true
}

// finish records that the SDK is done with the call.
func (cs *callStream) finish() {
	cs.mu.Lock()
	cs.finished = true
	keep := cs.resumable && (cs.started || cs.head != nil && cs.head.sse)
	cs.wake()
	cs.mu.Unlock()
	cs.store.finished(cs, keep)
}

// over reports whether the call was answered or has ended.
func (cs *callStream) over() bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.answered || cs.finished
}

// spent reports whether nothing after event after will come.
func (cs *callStream) spent(after int) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return (cs.finished || cs.answered) && after >= len(cs.events)
}

// follow writes the stream to w from the event after index after until the
// call is answered or over, or ctx ends (the client went away). A new
// stream (prime) opens with an event that carries only an id.
func (cs *callStream) follow(ctx context.Context, w http.ResponseWriter, after int, prime bool) {
	rc := http.NewResponseController(w)
	headed := false
	for {
		cs.mu.Lock()
		head, change := cs.head, cs.change
		ready := head != nil || cs.answered || cs.finished || cs.started && cs.resumable
		over := cs.answered || cs.finished
		var batch [][]byte
		if after < len(cs.events) {
			batch = slices.Clone(cs.events[after:])
		}
		body := cs.body
		cs.mu.Unlock()

		if !headed && head != nil && !head.sse {
			if !over {
				if !wait(ctx, change) {
					return
				}
				continue
			}
			writePlain(w, head, body)
			return
		}
		if !headed && ready {
			headed = true
			h := w.Header()
			h.Set("Content-Type", "text/event-stream")
			h.Set("Cache-Control", "no-cache, no-transform")
			h.Set("X-Accel-Buffering", "no")
			w.WriteHeader(http.StatusOK)
			if prime && cs.prime {
				fmt.Fprintf(w, "id: %s_0\ndata: \n\n", cs.id)
			}
			rc.Flush()
		}
		if headed {
			for i, data := range batch {
				if data != nil && !cs.writeEvent(w, after+1+i, data) {
					return
				}
			}
			after += len(batch)
			rc.Flush()
			if over {
				return
			}
		}
		if !wait(ctx, change) {
			return
		}
	}
}

// writeEvent writes event n; false if the client is gone.
func (cs *callStream) writeEvent(w http.ResponseWriter, n int, data []byte) bool {
	var b bytes.Buffer
	b.Grow(len(data) + 64)
	b.WriteString("event: message\n")
	if cs.resumable {
		fmt.Fprintf(&b, "id: %s_%d\n", cs.id, n)
	}
	b.WriteString("data: ")
	b.Write(data)
	b.WriteString("\n\n")
	_, err := w.Write(b.Bytes())
	return err == nil
}

// writePlain copies a reply that is not an event stream: an error the SDK
// wrote before the call started, its message cut to a short head.
func writePlain(w http.ResponseWriter, head *streamHead, body []byte) {
	for k, v := range head.header {
		w.Header()[k] = v
	}
	w.Header().Del("Content-Length")
	if msg, err := jsonrpc.DecodeMessage(body); err == nil {
		if resp, ok := msg.(*jsonrpc.Response); ok && resp.Error != nil {
			if b, err := jsonrpc.EncodeMessage(capError(resp)); err == nil {
				body = b
			}
		}
	} else if head.code >= 400 && len(body) > maxErrorMessage {
		body = append([]byte(shortText(string(body))), '\n')
	}
	w.WriteHeader(head.code)
	w.Write(body)
}

// wait waits for change; false if ctx ended first.
func wait(ctx context.Context, change <-chan struct{}) bool {
	select {
	case <-change:
		return true
	case <-ctx.Done():
		return false
	}
}

// parseEventID reads a Last-Event-ID: "<stream>_<n>".
func parseEventID(s string) (stream string, n int, ok bool) {
	stream, num, ok := strings.Cut(s, "_")
	if !ok || stream == "" {
		return "", 0, false
	}
	n, err := strconv.Atoi(num)
	return stream, n, err == nil && n >= 0
}
