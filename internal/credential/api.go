package credential

import (
	"context"
	"log/slog"
	"net"
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
	ProtoCredential = "credential"
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
	Alias   string
	Method  string
	Path    string // normalised; the query is not recorded
	Status  int    // the status relayed or sent back
	Bytes   int64  // response body bytes relayed
	Allowed bool
	Note    string // which check refused, e.g. "not_permitted"
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
	Logger  *slog.Logger
}
