package mcpserver

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// wireLog records, in order, every message the server writes. Unlike the
// client's notification handler, which the SDK may run after the call's
// result is delivered, it shows what the server sent before what.
type wireLog struct {
	mu   sync.Mutex
	msgs []wireMsg
}

// wireMsg is the part of a written JSON-RPC message the tests look at.
type wireMsg struct {
	Method string          `json:"method"`
	ID     json.RawMessage `json:"id"`
	Result json.RawMessage `json:"result"`
	Params struct {
		ProgressToken any `json:"progressToken"`
	} `json:"params"`
}

func (l *wireLog) add(m jsonrpc.Message) {
	raw, err := jsonrpc.EncodeMessage(m)
	if err != nil {
		return
	}
	var w wireMsg
	if json.Unmarshal(raw, &w) != nil {
		return
	}
	l.mu.Lock()
	l.msgs = append(l.msgs, w)
	l.mu.Unlock()
}

// since returns the messages written from index i on, and the next index.
func (l *wireLog) since(i int) ([]wireMsg, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]wireMsg(nil), l.msgs[i:]...), len(l.msgs)
}

// recordingTransport wraps the server's transport so every write lands in
// a wireLog before it is sent.
type recordingTransport struct {
	mcp.Transport
	log *wireLog
}

func (t recordingTransport) Connect(ctx context.Context) (mcp.Connection, error) {
	c, err := t.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return recordingConn{Connection: c, log: t.log}, nil
}

type recordingConn struct {
	mcp.Connection
	log *wireLog
}

func (c recordingConn) Write(ctx context.Context, m jsonrpc.Message) error {
	c.log.add(m)
	return c.Connection.Write(ctx, m)
}
