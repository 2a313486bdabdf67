package credential

import (
	"fmt"
	"net"
	"net/http"
	"strconv"

	"isopod/internal/errdefs"
)

// Gateway is a VM's credential endpoint: an http.Handler for requests to
// /<alias>/<path>, each checked against the alias's allow rules and then
// made anew to https://<host>/<path> with the secret added.
type Gateway struct {
	cfg GatewayConfig
}

// NewGateway makes the endpoint of cfg's credentials.
func NewGateway(cfg GatewayConfig) (*Gateway, error) {
	return nil, fmt.Errorf("credential gateway: not implemented: %w", errdefs.ErrNotSupported)
}

// ServeHTTP serves one endpoint request (origin form, or the absolute
// form the :3128 proxy hands over).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "isopod credential endpoint: not implemented", http.StatusNotImplemented)
}

// Hosts are the credentials' hosts, which the VM's egress pins: nothing
// in the guest reaches them except through the endpoint.
func (g *Gateway) Hosts() []string {
	var out []string
	for _, c := range g.cfg.Credentials {
		out = append(out, c.Alias.Host)
	}
	return out
}

// Endpoint is the endpoint's URL for a guest whose gateway is gateway.
func Endpoint(gateway string) string {
	return "http://" + net.JoinHostPort(gateway, strconv.Itoa(EndpointPort))
}
