package vmnet

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"time"

	"isopod/internal/credential"
	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// A filtered network with credentials serves the credential endpoint on
// the gateway (credential.EndpointPort): the run's credentials live in
// this process alone, and the guest gets the endpoint's URL, never a
// secret. Their hosts are pinned in the run's Filter, so the guest's own
// way to them is refused.

// pinLookupTimeout bounds the resolution of the credential hosts whose
// addresses are pinned when the network starts.
const pinLookupTimeout = 2 * time.Second

// credentials is a filtered network's credential endpoint.
type credentials struct {
	gw       *credential.Gateway
	srv      *http.Server
	injected []string // the aliases, for the report
	endpoint string   // the endpoint's URL in the guest
}

// newCredentials makes the endpoint of creds, recording each request on
// rec; nil when there are none.
func newCredentials(creds []Credential, rec flightrec.Recorder, cfg Config) (*credentials, error) {
	if len(creds) == 0 {
		return nil, nil
	}
	c := &credentials{}
	for _, cr := range creds {
		c.injected = append(c.injected, cr.Alias.Name)
	}
	gw, err := credential.NewGateway(credential.GatewayConfig{Credentials: creds, Logger: cfg.Logger, MaxBody: cfg.CredentialMaxBody,
		Record: func(ev credential.Event) { rec.Record(ev.Flight()) }})
	if err != nil {
		return nil, err
	}
	c.gw = gw
	return c, nil
}

// Credential is one credential a run injects.
type Credential = credential.Credential

// pins are the credentials' hosts and the addresses they resolve to now,
// for the Filter. A host that does not resolve pins its name only.
func (c *credentials) pins(lookup func(context.Context, string) ([]netip.Addr, error)) (egress.Pins, error) {
	if c == nil {
		return egress.Pins{}, nil
	}
	hosts := c.gw.Hosts()
	var addrs []netip.Addr
	for _, h := range hosts {
		ctx, cancel := context.WithTimeout(context.Background(), pinLookupTimeout)
		as, err := lookup(ctx, h)
		cancel()
		if err == nil {
			addrs = append(addrs, as...)
		}
	}
	return egress.ParsePins(hosts, addrs)
}

// serve serves the endpoint on l, the gateway's EndpointPort, for a
// guest whose gateway is gateway.
func (c *credentials) serve(l net.Listener, gateway string, log *slog.Logger) {
	c.endpoint = credential.Endpoint(gateway)
	c.srv = &http.Server{Handler: c.gw, ReadHeaderTimeout: 30 * time.Second}
	srv := c.srv
	go func() {
		if err := srv.Serve(l); err != nil && err != http.ErrServerClosed {
			log.Debug("credential endpoint ended", "err", err)
		}
	}()
}

// close ends the endpoint's connections. Idempotent.
func (c *credentials) close() {
	if c != nil && c.srv != nil {
		c.srv.Close()
	}
}

// credentialReport is a filtered run's egress block with credentials:
// the aliases injected and the endpoint's URL beside the record. It
// holds no secret.
type credentialReport struct {
	*flightrec.Report
	Injected           []string `json:"injected"`
	CredentialEndpoint string   `json:"credential_endpoint"`
}

// report adds the credentials to rep.
func (c *credentials) report(rep *flightrec.Report) any {
	if c == nil {
		return rep
	}
	return &credentialReport{Report: rep, Injected: slices.Clone(c.injected), CredentialEndpoint: c.endpoint}
}
