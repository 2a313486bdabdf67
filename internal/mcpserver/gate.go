package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/auth"
)

// The gate stands between the bearer-token check and the SDK's stateless
// streamable HTTP handler. It reads each POST's JSON-RPC message and, for
// a tools/call:
//
//   - gives the call a context of its own, ended when the client goes
//     away or when a notifications/cancelled (sent by the same token, in
//     another POST, as clients of the older protocol versions do) names
//     its request id; the handler's run follows it (the SDK keeps the HTTP
//     request's context values in its stateless handlers' contexts);
//   - for sandbox_run, takes the call's place in the admission queue, and
//     answers 503 (with a JSON-RPC error saying why, and Retry-After) when
//     there is none, before the SDK starts a response.
type gate struct {
	s    *Server
	next http.Handler

	mu    sync.Mutex // guards following
	calls map[callKey]map[*httpCall]context.CancelFunc
}

// callKey names a call as a cancellation does: by who sent it and its id.
type callKey struct{ principal, id string }

// maxBody bounds a POST's body: a 4 MiB stdin, escaped, with room.
const maxBody = 12 << 20

// codeBusy is the JSON-RPC error code of a busy host's 503.
const codeBusy = -32050

func newGate(s *Server, next http.Handler) *gate {
	return &gate{s: s, next: next, calls: map[callKey]map[*httpCall]context.CancelFunc{}}
}

// peeked is what the gate reads of a message.
type peeked struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Params struct {
		Name      string `json:"name"`
		Arguments struct {
			MemMiB json.Number `json:"mem_mib"`
		} `json:"arguments"`
		RequestID json.RawMessage `json:"requestId"`
	} `json:"params"`
}

func (g *gate) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.Body == nil {
		g.next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, fmt.Sprintf("request body over %d bytes", maxBody), http.StatusRequestEntityTooLarge)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	var m peeked
	if json.Unmarshal(body, &m) != nil {
		g.next.ServeHTTP(w, r) // the SDK answers what it cannot read
		return
	}
	principal := ""
	if ti := auth.TokenInfoFromContext(r.Context()); ti != nil {
		principal = ti.UserID
	}
	switch {
	case m.Method == "notifications/cancelled" && len(m.Params.RequestID) > 0:
		g.cancel(callKey{principal, string(bytes.TrimSpace(m.Params.RequestID))})
	case m.Method == "tools/call" && len(m.ID) > 0:
		g.serveCall(w, r, callKey{principal, string(bytes.TrimSpace(m.ID))}, m)
		return
	}
	g.next.ServeHTTP(w, r)
}

// serveCall passes a tools/call on with its own context, and for
// sandbox_run its admission ticket.
func (g *gate) serveCall(w http.ResponseWriter, r *http.Request, key callKey, m peeked) {
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	call := &httpCall{ctx: ctx}
	if m.Params.Name == ToolSandboxRun && g.s.cfg.Admission != nil {
		mem, _ := strconv.Atoi(m.Params.Arguments.MemMiB.String())
		t, err := g.s.cfg.Admission.Reserve(runMemMiB(mem))
		if err != nil {
			g.s.log.Info("tool refused", "tool", ToolSandboxRun, "principal", key.principal, "err", err)
			writeBusy(w, m.ID, err)
			return
		}
		// The handler owns the place once it runs; whatever happens to the
		// call, it is given back when the response is over.
		defer t.Release()
		call.ticket = t
	}
	g.add(key, call, cancel)
	defer g.remove(key, call)
	g.next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httpCallKey{}, call)))
}

// writeBusy answers a call the host has no place for: 503 with
// Retry-After, and the reason as a JSON-RPC error.
func writeBusy(w http.ResponseWriter, id json.RawMessage, err error) {
	b, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{JSONRPC: "2.0", ID: id, Error: struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{codeBusy, busyText(err)}})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Retry-After", "2")
	w.WriteHeader(http.StatusServiceUnavailable)
	w.Write(b)
}

func (g *gate) add(k callKey, c *httpCall, cancel context.CancelFunc) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.calls[k] == nil {
		g.calls[k] = map[*httpCall]context.CancelFunc{}
	}
	g.calls[k][c] = cancel
}

func (g *gate) remove(k callKey, c *httpCall) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.calls[k], c)
	if len(g.calls[k]) == 0 {
		delete(g.calls, k)
	}
}

// cancel ends the calls k names.
func (g *gate) cancel(k callKey) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, cancel := range g.calls[k] {
		cancel()
	}
	if len(g.calls[k]) > 0 {
		g.s.log.Info("call cancelled by the client", "principal", k.principal, "id", k.id)
	}
}
