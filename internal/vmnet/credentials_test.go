package vmnet

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/credential"
	"isopod/internal/egress"
	"isopod/internal/errdefs"
)

// testSecret is the secret of the test store's alias.
const testSecret = "s3cr3t-value-never-in-the-guest"

// resolveTest resolves alias "gh" (host api.example.org, bearer, from an
// environment variable) from a store of the test's own. It skips while
// the credential package is the contract alone.
func resolveTest(t *testing.T) []credential.Credential {
	t.Helper()
	path := filepath.Join(t.TempDir(), credential.StoreFile)
	store := `{"version":1,"credentials":{"gh":{"host":"api.example.org","scheme":"bearer","source":"env:TEST_TOKEN","allow":["readonly"]}}}`
	if err := os.WriteFile(path, []byte(store), 0o600); err != nil {
		t.Fatal(err)
	}
	lookup := func(k string) (string, bool) { return testSecret, k == "TEST_TOKEN" }
	creds, err := credential.Resolve(path, []string{"gh"}, credential.Operator, lookup, nil)
	if errors.Is(err, errdefs.ErrNotSupported) {
		t.Skip("the credential package is not implemented here")
	}
	if err != nil {
		t.Fatalf("Resolve: %v", err)
	}
	return creds
}

// TestNetworkCredentials: a filtered network with credentials gives the
// guest the endpoint's URL and leaves the gateway out of the proxies, and
// its egress block names the aliases and the endpoint, never the secret.
func TestNetworkCredentials(t *testing.T) {
	privateSockets(t)
	creds := resolveTest(t)
	rules, err := egress.ParseRules(egress.Switches{DenyAll: true})
	if err != nil {
		t.Fatal(err)
	}
	n, err := Start(Config{Scope: "s1", ID: "vm-cred", Dir: t.TempDir(), Rules: rules, Start: time.Now(), Credentials: creds})
	if err != nil {
		t.Fatalf("StartNetwork: %v", err)
	}
	defer n.Close()
	ac := n.AgentConfig()
	endpoint := "http://" + ac.Gateway + ":3129"
	for _, want := range append(ProxyEnv(ac.Gateway, ac.Gateway), credential.EndpointEnv+"="+endpoint) {
		if !slices.Contains(ac.Env, want) {
			t.Errorf("agent env %v lacks %s", ac.Env, want)
		}
	}
	if !n.filter.PinnedName("api.example.org") {
		t.Error("the credential's host is not pinned")
	}
	b, err := json.Marshal(n.EgressReport())
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Mode     string   `json:"mode"`
		Injected []string `json:"injected"`
		Endpoint string   `json:"credential_endpoint"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "filtered" || !slices.Equal(rep.Injected, []string{"gh"}) || rep.Endpoint != endpoint {
		t.Errorf("egress block %s; want filtered, injected [gh], credential_endpoint %s", b, endpoint)
	}
	if strings.Contains(string(b)+strings.Join(ac.Env, " "), testSecret) {
		t.Error("the secret is in the egress block or the guest's environment")
	}
}

// TestNATRefusesCredentials: credentials need filtered egress.
func TestNATRefusesCredentials(t *testing.T) {
	privateSockets(t)
	cr := credential.Credential{Alias: credential.Alias{Name: "gh", Host: "api.example.org"}}
	_, err := Start(Config{Scope: "s1", ID: "vm-natcred", Dir: t.TempDir(), Credentials: []credential.Credential{cr}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("NAT with credentials: %v; want invalid argument", err)
	}
}
