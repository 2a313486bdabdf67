package oci

import (
	"fmt"

	"github.com/docker/cli/cli/config"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
)

// Keychain resolves credentials the way the docker CLI does, from the
// config.json in one directory: its auths entries, its credsStore and its
// credHelpers (which run docker-credential-NAME programs). Nothing is
// stored: each lookup reads the file again. An empty Dir means anonymous.
type Keychain struct {
	Dir string
}

var _ authn.Keychain = Keychain{}

// Resolve implements authn.Keychain: the repository's own entry first,
// then its registry's; anonymous when neither has one.
func (k Keychain) Resolve(target authn.Resource) (authn.Authenticator, error) {
	if k.Dir == "" {
		return authn.Anonymous, nil
	}
	cf, err := config.Load(k.Dir)
	if err != nil {
		return nil, fmt.Errorf("reading the Docker configuration in %s: %w", k.Dir, err)
	}
	for _, key := range []string{target.String(), target.RegistryStr()} {
		if key == name.DefaultRegistry {
			key = authn.DefaultAuthKey // the default registry's historical key
		}
		ac, err := cf.GetAuthConfig(key)
		if err != nil {
			return nil, fmt.Errorf("credentials for %s: %w", key, err)
		}
		if ac.Username == "" && ac.Password == "" && ac.Auth == "" && ac.IdentityToken == "" && ac.RegistryToken == "" {
			continue
		}
		return authn.FromConfig(authn.AuthConfig{
			Username: ac.Username, Password: ac.Password, Auth: ac.Auth,
			IdentityToken: ac.IdentityToken, RegistryToken: ac.RegistryToken,
		}), nil
	}
	return authn.Anonymous, nil
}
