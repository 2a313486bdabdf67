package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"isopod/internal/admission"
)

// The gate stands between the bearer-token check and the SDK's stateless
// streamable HTTP handler. It reads each POST's JSON-RPC message and, for a
// call (a request with an id):
//
//   - for sandbox_run, takes the call's place in the admission queue, and
//     answers 503 (with a JSON-RPC error saying why, and Retry-After) when
//     there is none, before anything else;
//   - runs the SDK's handler on a call stream of its own (streams.go), with
//     a context that a dropped connection does not end: the call goes on,
//     and a client that reconnects with Last-Event-ID (a GET, answered
//     here) gets the rest of the stream, its result included. Under the
//     2026-07-28 protocol the POST is the call, and its end cancels it;
//   - ends the call when a notifications/cancelled (sent by the same token,
//     in another POST, as clients of the older protocol versions do) names
//     its request id: the run is cancelled and no response is sent;
//   - when the server stops, answers it with a JSON-RPC error saying so.
//
// Any other message goes to the SDK as it is, an error reply's body cut
// to a short head.
type gate struct {
	s       *Server
	next    http.Handler
	streams *streamStore

	mu      sync.Mutex // guards following and wg.Add against shutdown
	calls   map[callKey]map[*httpCall]context.CancelFunc
	closing bool
	wg      sync.WaitGroup // the calls' handlers, which may outlive their POSTs
}

// callKey names a call as a cancellation does: by who sent it and its id.
type callKey struct{ principal, id string }

// maxBody bounds a POST's body: a 4 MiB stdin, escaped, with room.
const maxBody = 12 << 20

// JSON-RPC error codes of this server.
const (
	// codeBusy: the host has no place for a sandbox_run (HTTP 503).
	codeBusy = -32050
	// codeShuttingDown: the server is stopping; the call was cancelled.
	codeShuttingDown = -32051
)

// shutdownText answers the calls in flight when the server stops.
const shutdownText = "isopod-mcp is shutting down: the call was cancelled and any VM it started is torn down; call again once the server is back (over HTTP, another host can take it)"

func newGate(s *Server, next http.Handler) *gate {
	return &gate{s: s, next: next, streams: newStreamStore(resumeKeep, resumeBudget),
		calls: map[callKey]map[*httpCall]context.CancelFunc{}}
}

// peeked is what the gate reads of a message.
type peeked struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Params json.RawMessage `json:"params"`
}

// callParams is what the gate reads of a call's params.
type callParams struct {
	Name      string `json:"name"`
	Arguments struct {
		MemMiB json.RawMessage `json:"mem_mib"`
	} `json:"arguments"`
	RequestID json.RawMessage `json:"requestId"`
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.Header.Get("Last-Event-ID") != "" {
		g.resume(w, r)
		return
	}
	if r.Method != http.MethodPost || r.Body == nil {
		g.next.ServeHTTP(&cappedWriter{ResponseWriter: w}, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("request body over %d bytes (%d MiB)", maxBody, maxBody>>20), http.StatusRequestEntityTooLarge)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var m peeked
	var p callParams
	if json.Unmarshal(body, &m) == nil && len(m.Params) > 0 {
		json.Unmarshal(m.Params, &p) // best effort: the SDK judges the params
	}
	key := callKey{principal: principalOf(r)}
	switch {
	case m.Method == "notifications/cancelled" && len(p.RequestID) > 0:
		key.id = string(bytes.TrimSpace(p.RequestID))
		g.cancel(key)
	case m.Method != "" && len(m.ID) > 0 && string(m.ID) != "null":
		key.id = string(bytes.TrimSpace(m.ID))
		g.serveCall(w, r, key, m, p)
		return
	}
	g.next.ServeHTTP(&cappedWriter{ResponseWriter: w}, r)
}

// principalOf is who sent r: its token's line.
func principalOf(r *http.Request) string {
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		return ti.UserID
	}
	return ""
}

// serveCall runs a call on a stream of its own and follows the stream on
// the POST's response; for sandbox_run it first takes a VM place.
func (g *gate) serveCall(w http.ResponseWriter, r *http.Request, key callKey, m peeked, p callParams) {
	var ticket *admission.Ticket
	if m.Method == "tools/call" && p.Name == ToolSandboxRun && g.s.cfg.Admission != nil {
		mem, _ := strconv.Atoi(strings.Trim(string(p.Arguments.MemMiB), `" `))
		t, err := g.s.cfg.Admission.Reserve(runMemMiB(mem))
		if err != nil {
			g.s.log.Info("tool refused", "tool", ToolSandboxRun, "principal", key.principal, "err", err)
			writeRefusal(w, m.ID, codeBusy, busyText(err))
			return
		}
		ticket = t
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	call := &httpCall{ctx: ctx, ticket: ticket,
		stream: g.streams.open(key.principal, m.ID, r.Header.Get("Mcp-Protocol-Version"))}
	if !g.add(key, call, cancel) {
		cancel()
		call.stream.finish()
		if ticket != nil {
			ticket.Release()
		}
		writeRefusal(w, m.ID, codeShuttingDown, shutdownText)
		return
	}
	if !call.stream.resumable {
		// The 2026-07-28 protocol: the POST is the call.
		defer context.AfterFunc(r.Context(), func() { call.stream.drop(); cancel() })()
	}
	go g.run(key, call, cancel, r)
	call.stream.follow(r.Context(), w, 0, true)
	if r.Context().Err() != nil && call.stream.resumable && !call.stream.over() {
		g.s.log.Info("the client went away; the call goes on and may be resumed", "principal", key.principal, "id", key.id)
	}
}

// run serves the call on its stream; whatever happens to the call, its
// place is given back when the handler is done.
func (g *gate) run(key callKey, call *httpCall, cancel context.CancelFunc, r *http.Request) {
	defer g.wg.Done()
	defer cancel()
	defer g.remove(key, call)
	if call.ticket != nil {
		defer call.ticket.Release()
	}
	defer call.stream.finish()
	g.next.ServeHTTP(newRecorder(call.stream), r.WithContext(context.WithValue(call.ctx, httpCallKey{}, call)))
}

// resume answers a GET with Last-Event-ID: the rest of the stream it
// names, as long as the server keeps it and the same token asks.
func (g *gate) resume(w http.ResponseWriter, r *http.Request) {
	last := r.Header.Get("Last-Event-ID")
	id, n, ok := parseEventID(last)
	var cs *callStream
	if ok {
		cs = g.streams.get(id)
	}
	if cs == nil || cs.principal != principalOf(r) {
		http.Error(w, fmt.Sprintf("no call stream %s here: it ended more than %v ago, or was sent to another server or with another token; call again",
			describe(last), resumeKeep), http.StatusNotFound)
		return
	}
	if cs.spent(n) {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	cs.follow(r.Context(), w, n, false)
}

// writeRefusal answers a call the server takes no place for (the host is
// full, or the server is stopping): 503 with Retry-After, and the reason
// as a JSON-RPC error.
func writeRefusal(w http.ResponseWriter, id json.RawMessage, code int64, message string) {
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   jsonrpc.Error   `json:"error"`
	}{"2.0", id, jsonrpc.Error{Code: code, Message: message}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "2")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(b)
}

// add registers a call; false once the server is stopping.
func (g *gate) add(k callKey, c *httpCall, cancel context.CancelFunc) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return false
	}
	if g.calls[k] == nil {
		g.calls[k] = map[*httpCall]context.CancelFunc{}
	}
	g.calls[k][c] = cancel
	g.wg.Add(1)
	return true
}

func (g *gate) remove(k callKey, c *httpCall) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.calls[k], c)
	if len(g.calls[k]) == 0 {
		delete(g.calls, k)
	}
}

// cancel ends the calls k names; none of them is answered.
func (g *gate) cancel(k callKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for c, cancel := range g.calls[k] {
		c.stream.drop()
		cancel()
	}
	if len(g.calls[k]) > 0 {
		g.s.log.Info("call cancelled by the client", "principal", k.principal, "id", k.id)
	}
}

// shutdown answers every call in flight with codeShuttingDown, and takes
// no new ones. The runs are cancelled by the server.
func (g *gate) shutdown() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.closing = true
	for _, calls := range g.calls {
		for c := range calls {
			c.stream.abort(codeShuttingDown, shutdownText)
		}
	}
}

// wait waits for the calls' handlers to return, until ctx ends.
func (g *gate) wait(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		g.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// cappedWriter cuts the body of an error reply (status 400 and up) to a
// short head.
type cappedWriter struct {
	http.ResponseWriter
	code, n int
}

func (c *cappedWriter) WriteHeader(code int) {
	if c.code == 0 {
		c.code = code
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *cappedWriter) Write(p []byte) (int, error) {
	if c.code == 0 {
		c.code = http.StatusOK
	}
	if c.code < 400 {
		return c.ResponseWriter.Write(p)
	}
	room := maxErrorMessage - c.n
	if room > 0 {
		k := min(room, len(p))
		c.n += k
		if _, err := c.ResponseWriter.Write(p[:k]); err != nil {
			return 0, err
		}
	}
	return len(p), nil
}

func (c *cappedWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }
