package sandbox

import (
	"fmt"
	"path/filepath"
	"slices"

	"isopod/internal/credential"
	"isopod/internal/egress"
)

// Credentials a run injects (internal/credential). The run names aliases
// of the state root's store; they are resolved on the host before any VM
// starts (a warm-pool snapshot build included), and their secrets stay in
// this process: the VM's gateway serves the credential endpoint and pins
// their hosts (machine/credentials.go). Nothing secret reaches the guest,
// so a run with credentials is warm-eligible like any filtered run, and a
// commit cannot capture a secret.

// CredentialStore is the credential store of the state root at home.
func CredentialStore(home string) string { return filepath.Join(home, credential.StoreFile) }

// checkInject refuses credentials without a network: they are used
// through the VM's gateway.
func checkInject(req Request) error {
	if slices.Contains(req.Inject, "") {
		return argError("inject", nil, "an alias is empty; name one declared in the credential store")
	}
	if len(req.Inject) > 0 && req.NoNetwork {
		return argError("inject", nil, "needs the network: the guest reaches a credential through its gateway; drop --no-network (network: false) or inject nothing")
	}
	return nil
}

// injectSwitches makes a request that injects credentials but names no
// network switch ask for filtered egress with nothing else allowed.
func injectSwitches(r Request, sw egress.Switches) egress.Switches {
	if len(r.Inject) > 0 && sw.Mode() == egress.ModeNAT {
		sw.AllowHosts = []string{}
	}
	return sw
}

// resolveCredentials resolves req.Inject from the state root's store,
// reading their secrets from their sources through the front end's
// environment. No aliases: no I/O at all. The errors are Resolve's:
// specific for the operator, one uniform refusal for a model.
func (s *Service) resolveCredentials(req Request) ([]credential.Credential, error) {
	if len(req.Inject) == 0 {
		return nil, nil
	}
	lookup := s.opts.LookupEnv
	if lookup == nil {
		lookup = func(string) (string, bool) { return "", false }
	}
	store := s.opts.CredentialStore
	if store == "" {
		store = CredentialStore(s.opts.Paths.Home)
	}
	creds, err := credential.Resolve(store, req.Inject, req.Caller, lookup, s.log)
	if err != nil {
		if req.Caller == credential.Model {
			return nil, err
		}
		return nil, fmt.Errorf("--inject: %w", err)
	}
	return creds, nil
}
