package mcpserver

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// streamStore holds the call streams: running ones, and finished ones a
// client may still resume (see streams.go).
type streamStore struct {
	keep   time.Duration
	budget int64
	bytes  atomic.Int64 // what every stream held holds

	mu   sync.Mutex // guards following
	byID map[string]*callStream
	kept []endedStream // finished and kept, oldest first
}

type endedStream struct {
	cs *callStream
	at time.Time
}

func newStreamStore(keep time.Duration, budget int64) *streamStore {
	return &streamStore{keep: keep, budget: budget, byID: map[string]*callStream{}}
}

// open starts the stream of the call reqID, which principal sent.
func (st *streamStore) open(principal string, reqID json.RawMessage, protocol string) *callStream {
	resumable := protocol < protocolStateless
	cs := &callStream{
		id: rand.Text(), principal: principal, reqID: reqID, store: st,
		resumable: resumable, prime: resumable && protocol >= protocolPrimed,
		change: make(chan struct{}),
	}
	cs.grow(streamOverhead)
	st.mu.Lock()
	defer st.mu.Unlock()
	st.byID[cs.id] = cs
	return cs
}

// get returns the stream id names, if it is held.
func (st *streamStore) get(id string) *callStream {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.prune(time.Now())
	return st.byID[id]
}

// finished keeps a finished stream for resumption, or lets it go.
func (st *streamStore) finished(cs *callStream, keep bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if keep {
		st.kept = append(st.kept, endedStream{cs, time.Now()})
	} else {
		st.remove(cs)
	}
	st.prune(time.Now())
}

// prune lets go of finished streams older than keep, and of the oldest
// while the store is over its budget. st.mu must be held.
func (st *streamStore) prune(now time.Time) {
	n := 0
	for n < len(st.kept) && (now.Sub(st.kept[n].at) >= st.keep || st.bytes.Load() > st.budget) {
		st.remove(st.kept[n].cs)
		st.kept[n] = endedStream{}
		n++
	}
	st.kept = st.kept[n:]
	if cap(st.kept) > 64 && len(st.kept) < cap(st.kept)/4 {
		st.kept = append([]endedStream(nil), st.kept...)
	}
}

// remove lets go of cs. st.mu must be held.
func (st *streamStore) remove(cs *callStream) {
	if st.byID[cs.id] == cs {
		delete(st.byID, cs.id)
		st.bytes.Add(-cs.size.Load())
	}
}

// recorder is the http.ResponseWriter the SDK answers a call on: it
// records the reply into the call's stream, an event at a time.
type recorder struct {
	cs     *callStream
	header http.Header
	wrote  bool
	sse    bool
	buf    []byte // the start of an event not yet complete
}

func newRecorder(cs *callStream) *recorder {
	return &recorder{cs: cs, header: http.Header{}}
}

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(code int) {
	if r.wrote {
		return
	}
	r.wrote = true
	r.sse = code == http.StatusOK && strings.HasPrefix(r.header.Get("Content-Type"), "text/event-stream")
	r.cs.setHead(&streamHead{code: code, header: r.header.Clone(), sse: r.sse})
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.wrote {
		r.WriteHeader(http.StatusOK)
	}
	if !r.sse {
		r.cs.addBody(p)
		return len(p), nil
	}
	r.buf = append(r.buf, p...)
	for {
		i := bytes.Index(r.buf, []byte("\n\n"))
		if i < 0 {
			break
		}
		if data := eventData(r.buf[:i]); data != nil {
			r.cs.addEvent(data)
		}
		r.buf = append(r.buf[:0], r.buf[i+2:]...)
	}
	return len(p), nil
}

// Flush: the stream's followers write each event as it is recorded.
func (r *recorder) Flush() {}

// eventData is the data of one server-sent event of type message (the
// type the SDK sends messages as), nil for any other.
func eventData(ev []byte) []byte {
	var data [][]byte
	for line := range bytes.SplitSeq(ev, []byte("\n")) {
		field, value, _ := bytes.Cut(line, []byte(":"))
		value = bytes.TrimPrefix(value, []byte(" "))
		switch string(field) {
		case "event":
			if string(value) != "message" {
				return nil
			}
		case "data":
			data = append(data, value)
		}
	}
	if len(data) == 0 {
		return nil
	}
	return bytes.Join(data, []byte("\n"))
}
