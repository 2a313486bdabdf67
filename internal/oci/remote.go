package oci

import (
	"context"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Client is how isopod talks to registries: whose credentials, over which
// transport, and how little a request may move before it is given up on.
// The zero value is anonymous over the default transport with
// DefaultStall.
type Client struct {
	Keychain  authn.Keychain    // nil: anonymous
	Transport http.RoundTripper // nil: remote.DefaultTransport
	UserAgent string
	Stall     Stall // zero: DefaultStall
}

// Options are the go-containerregistry options of one call under ctx.
// Every request goes through isopod's transport: watched for stalls, its
// manifests capped (see watchTransport).
func (c Client) Options(ctx context.Context) []remote.Option {
	kc := c.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain()
	}
	next := c.Transport
	if next == nil {
		next = remote.DefaultTransport
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc),
		remote.WithTransport(&watchTransport{next: next, stall: c.Stall.resolved()})}
	if c.UserAgent != "" {
		opts = append(opts, remote.WithUserAgent(c.UserAgent))
	}
	return opts
}
