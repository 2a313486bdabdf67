package credential

import (
	"context"
	"log/slog"
	"net"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// Where the store lives and where the guest reaches the endpoint.
const (
	// StoreFile is the store's name in the state root.
	StoreFile = "credentials.json"
	// EndpointPort is the credential endpoint's port on the gateway.
	EndpointPort = 3129
	// EndpointEnv names the guest's variable holding the endpoint's URL.
	EndpointEnv = "ISOPOD_CREDENTIAL_ENDPOINT"
	// ProtoCredential is the flight-recorder proto of endpoint requests.
	ProtoCredential = egress.ProtoCredential
	// DefaultMaxBody caps a request body sent through the endpoint.
	DefaultMaxBody = 256 << 20
)

// Caller says who names the aliases: the operator (CLI) gets specific
// errors; a model (MCP) gets one uniform refusal and may use only aliases
// marked "mcp": true.
type Caller int

const (
	Operator Caller = iota
	Model
)

// Credential is one resolved alias: its declaration and its secret, read
// from its source. It is what a VM's gateway is given.
type Credential struct {
	Alias  Alias
	secret Secret
}

// Event is one endpoint request, for the flight recorder: served (Allowed)
// or refused, with the check that refused it in Note.
type Event struct {
	Time    time.Time // when the request arrived
	Alias   string    // lower case; a name from the guest that is no alias's as <invalid:N>
	Host    string    // the alias's host; empty for an unknown alias
	Method  string
	Path    string // normalised; the query is not recorded
	Status  int    // the status relayed or sent back
	Bytes   int64  // response body bytes relayed
	BytesUp int64  // request body bytes sent upstream
	Allowed bool   // the checks passed (the host may still have failed: Note says)
	Note    string // which check refused, e.g. "not_permitted", or how the host failed
}

// GatewayConfig configures a VM's credential endpoint.
type GatewayConfig struct {
	Credentials []Credential
	// Record receives one Event per request; nil: none.
	Record func(Event)
	// Dial connects to an alias's host (host:443); nil: a net.Dialer.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxBody caps a request body; 0: DefaultMaxBody.
	MaxBody int64
	// HeadTimeout bounds the wait for the host's response head once the
	// request is sent; 0: DefaultHeadTimeout.
	HeadTimeout time.Duration
	// BodyIdleTimeout bounds the wait for each part of a request body:
	// a body that stops arriving for that long is refused (408,
	// NoteBodyStalled); 0: DefaultBodyIdleTimeout.
	BodyIdleTimeout time.Duration
	Logger          *slog.Logger
}

// Flight is e as the flight recorder keeps it: proto credential, the
// alias's host on port 443, reason credential_allowed or, refused,
// credential_refused with the check in note; the response body's bytes
// as bytes (and bytes_down). Wire a gateway's Record to a recorder with
// func(e Event) { rec.Record(e.Flight()) }.
func (e Event) Flight() flightrec.Event {
	ev := flightrec.Event{Time: e.Time, Proto: egress.ProtoCredential, Host: e.Host, Allowed: e.Allowed,
		Reason: egress.ReasonCredentialAllowed, BytesUp: e.BytesUp, BytesDown: e.Bytes,
		Alias: e.Alias, Method: e.Method, Path: e.Path, Status: e.Status, Note: e.Note}
	if !e.Allowed {
		ev.Reason = egress.ReasonCredentialRefused
	}
	if e.Host != "" {
		ev.Port = 443
	}
	return ev
}
