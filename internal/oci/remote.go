package oci

import (
	"context"
	"net/http"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// Client is how isopod talks to registries: whose credentials, over which
// transport. The zero value is anonymous over the default transport.
type Client struct {
	Keychain  authn.Keychain    // nil: anonymous
	Transport http.RoundTripper // nil: remote.DefaultTransport
	UserAgent string
}

// Options are the go-containerregistry options of one call under ctx.
func (c Client) Options(ctx context.Context) []remote.Option {
	kc := c.Keychain
	if kc == nil {
		kc = authn.NewMultiKeychain()
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(kc)}
	if c.Transport != nil {
		opts = append(opts, remote.WithTransport(c.Transport))
	}
	if c.UserAgent != "" {
		opts = append(opts, remote.WithUserAgent(c.UserAgent))
	}
	return opts
}
