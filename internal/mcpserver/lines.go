package mcpserver

import (
	"bytes"
	"encoding/json"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// wireMessage is a JSON-RPC message as sent, each member kept raw so that
// its presence and JSON type can be checked.
type wireMessage struct {
	JSONRPC json.RawMessage `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Method  json.RawMessage `json:"method"`
	Params  json.RawMessage `json:"params"`
	Result  json.RawMessage `json:"result"`
	Error   json.RawMessage `json:"error"`
}

// Methods a client may call before initialize: the handshake itself, ping
// (the specification allows it), and the stateless protocol's discovery.
var beforeInit = map[string]bool{"initialize": true, "ping": true, "server/discover": true}

// check returns the message on line for the SDK, or answers the line itself
// and returns nil.
func (c *lineConn) check(line []byte) jsonrpc.Message {
	if !json.Valid(line) {
		c.reply(nil, jsonrpc.CodeParseError, "parse error: the line is not valid JSON; send one JSON-RPC message per line")
		return nil
	}
	switch bytes.TrimSpace(line)[0] {
	case '{':
	case '[':
		c.reply(nil, jsonrpc.CodeInvalidRequest, "invalid request: batches are not supported; send one JSON-RPC message per line")
		return nil
	default:
		c.reply(nil, jsonrpc.CodeInvalidRequest, "invalid request: a JSON-RPC message is a JSON object")
		return nil
	}
	var w wireMessage
	if err := json.Unmarshal(line, &w); err != nil {
		c.reply(nil, jsonrpc.CodeInvalidRequest, "invalid request: a JSON-RPC message is a JSON object")
		return nil
	}
	id := validID(w.ID)
	if why := w.problem(id); why != "" {
		c.reply(id, jsonrpc.CodeInvalidRequest, "invalid request: "+why)
		return nil
	}
	msg, err := jsonrpc.DecodeMessage(line)
	if err != nil {
		c.reply(id, jsonrpc.CodeInvalidRequest, "invalid request: not a JSON-RPC 2.0 request, notification or response")
		return nil
	}
	if req, ok := msg.(*jsonrpc.Request); ok && !c.admit(req) {
		c.reply(id, jsonrpc.CodeInvalidRequest, "invalid request: the session is not initialized; send initialize first")
		return nil
	}
	return msg
}

// problem says what makes w not a JSON-RPC 2.0 message, or "". id is w's
// id if it is a valid one.
func (w *wireMessage) problem(id json.RawMessage) string {
	if string(w.JSONRPC) != `"2.0"` {
		return `"jsonrpc" must be "2.0"`
	}
	if w.ID != nil && id == nil {
		return `"id" must be a string or an integer`
	}
	if w.Method != nil {
		var m string
		if json.Unmarshal(w.Method, &m) != nil || m == "" {
			return `"method" must be a non-empty string`
		}
		if w.Params != nil && !isStructured(w.Params) {
			return `"params" must be an object or an array`
		}
		return ""
	}
	if w.ID == nil {
		return `a message has a "method" (a request or notification) or an "id" (a response)`
	}
	if (w.Result == nil) == (w.Error == nil) {
		return `a response has exactly one of "result" and "error"`
	}
	return ""
}

// validID returns raw if it is a string or integer id, else nil.
func validID(raw json.RawMessage) json.RawMessage {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return nil
	}
	var v any
	if json.Unmarshal(raw, &v) != nil {
		return nil
	}
	switch x := v.(type) {
	case string:
		return raw
	case float64:
		if x == float64(int64(x)) && !bytes.ContainsAny(raw, ".eE") {
			return raw
		}
	}
	return nil
}

func isStructured(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && (raw[0] == '{' || raw[0] == '[')
}

// admit reports whether req may reach the SDK: any notification, and a
// call only once initialize was let through, unless it is one a client may
// make before (or carries the stateless protocol's version, which the SDK
// checks itself). It also tracks the calls in flight, and marks the ones a
// notifications/cancelled names.
func (c *lineConn) admit(req *jsonrpc.Request) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !req.IsCall() {
		if req.Method == "notifications/cancelled" {
			if id, ok := cancelledID(req.Params); ok && c.inflight[id] {
				c.cancelled[id] = true
			}
		}
		return true
	}
	if !c.initialized && !beforeInit[req.Method] && !stateless(req.Params) {
		return false
	}
	if req.Method == "initialize" {
		c.initialized, c.initID = true, req.ID
	}
	c.inflight[req.ID] = true
	return true
}

// cancelledID reads the request id a notifications/cancelled names.
func cancelledID(params json.RawMessage) (jsonrpc.ID, bool) {
	var p struct {
		RequestID any `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || p.RequestID == nil {
		return jsonrpc.ID{}, false
	}
	id, err := jsonrpc.MakeID(p.RequestID)
	return id, err == nil
}

// stateless reports whether a call carries the protocol version in its
// _meta, as calls of the sessionless protocol do.
func stateless(params json.RawMessage) bool {
	var p struct {
		Meta map[string]json.RawMessage `json:"_meta"`
	}
	if json.Unmarshal(params, &p) != nil {
		return false
	}
	_, ok := p.Meta[mcp.MetaKeyProtocolVersion]
	return ok
}
