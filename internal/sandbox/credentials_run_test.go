package sandbox_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"isopod/internal/credential"
	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

const runSecret = "tok-3f9a-never-in-a-guest"

// writeStore writes the state root's credential store with mode perm.
func writeStore(t *testing.T, home, body string, perm os.FileMode) string {
	t.Helper()
	path := sandbox.CredentialStore(home)
	if err := os.WriteFile(path, []byte(body), perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, perm); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunInjectRefusedBeforeBoot: aliases are resolved before any VM
// starts, the warm pool's snapshot builder included: a store that does
// not exist, or an alias it lacks, starts nothing.
func TestRunInjectRefusedBeforeBoot(t *testing.T) {
	t.Parallel()
	var home string
	s, d := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { home = o.Paths.Home })
	for _, tt := range []struct {
		name  string
		store string // "": none
		class []error
	}{
		{"no store", "", []error{errdefs.ErrFailedPrecondition, errdefs.ErrNotFound}},
		{"unknown alias", `{"version":1,"credentials":{"other":{"host":"api.example.org","scheme":"bearer","source":"env:T","allow":["readonly"]}}}`, []error{errdefs.ErrNotFound}},
	} {
		if tt.store != "" {
			writeStore(t, home, tt.store, 0o600)
		}
		_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, Inject: []string{"gh"}})
		if err == nil {
			t.Fatalf("%s: the run was not refused", tt.name)
		}
		if !errors.Is(err, errdefs.ErrNotSupported) && !slices.ContainsFunc(tt.class, func(c error) bool { return errors.Is(err, c) }) {
			t.Errorf("%s: %v; want %v", tt.name, err, tt.class)
		}
		if !strings.Contains(err.Error(), "--inject") {
			t.Errorf("%s: %v; want the flag named", tt.name, err)
		}
	}
	if ms := d.Machines(); len(ms) != 0 {
		t.Errorf("%d machines started; want none (not even a snapshot build)", len(ms))
	}
}

// TestRunWithoutInjectReadsNoStore: a run that injects nothing never
// reads the store, so a broken one does not matter to it.
func TestRunWithoutInjectReadsNoStore(t *testing.T) {
	t.Parallel()
	var home string
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { o.NoWarmPool, home = true, o.Paths.Home })
	writeStore(t, home, "not json", 0o644)
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}, AllowHosts: []string{}})
	if code(rep) != 0 {
		t.Errorf("exit %d", code(rep))
	}
}

// TestRunInjectWarm: a run with credentials is warm-eligible like any
// filtered run; its command gets the endpoint, never the secret, and its
// egress block names the alias and the endpoint.
func TestRunInjectWarm(t *testing.T) {
	t.Parallel()
	var home string
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) {
		home = o.Paths.Home
		o.LookupEnv = func(k string) (string, bool) { return runSecret, k == "GH_TOKEN" }
	})
	writeStore(t, home, `{"version":1,"credentials":{"gh":{"host":"api.example.org","scheme":"bearer","source":"env:GH_TOKEN","allow":["readonly"]}}}`, 0o600)
	rep, err := runErr(t, s, sandbox.Request{Argv: []string{"env"}, Inject: []string{"gh"}})
	if errors.Is(err, errdefs.ErrNotSupported) {
		t.Skip("the credential package is not implemented here")
	}
	if err != nil {
		t.Fatal(err)
	}
	if !rep.SnapshotBuilt || rep.Net == nil || rep.Net.Mode != sandbox.NetworkFiltered {
		t.Errorf("path %q built %v net %+v; want a filtered run in the warm pool's snapshot VM", rep.Path, rep.SnapshotBuilt, rep.Net)
	}
	if !strings.Contains(rep.Stdout, credential.EndpointEnv+"=http://") {
		t.Errorf("the command's environment lacks %s:\n%s", credential.EndpointEnv, rep.Stdout)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), runSecret) {
		t.Error("the report holds the secret")
	}
	var eg struct {
		Injected []string `json:"injected"`
		Endpoint string   `json:"credential_endpoint"`
	}
	e, _ := json.Marshal(rep.Egress)
	if err := json.Unmarshal(e, &eg); err != nil || len(eg.Injected) != 1 || eg.Injected[0] != "gh" || !strings.HasSuffix(eg.Endpoint, ":3129") {
		t.Errorf("egress block %s; want injected [gh] and the endpoint", e)
	}
	filepath.WalkDir(home, func(path string, de os.DirEntry, err error) error {
		if err == nil && de.Type().IsRegular() {
			if b, _ := os.ReadFile(path); strings.Contains(string(b), runSecret) {
				t.Errorf("%s holds the secret", path)
			}
		}
		return nil
	})
}

// TestRunInjectOwnStore: a Service given a store of its own resolves
// aliases from it, not from the state root's.
func TestRunInjectOwnStore(t *testing.T) {
	t.Parallel()
	own := filepath.Join(t.TempDir(), "store.json")
	body := `{"version":1,"credentials":{"gh":{"host":"api.example.org","scheme":"bearer","source":"env:GH_TOKEN","allow":["readonly"]}}}`
	if err := os.WriteFile(own, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) {
		o.NoWarmPool, o.CredentialStore = true, own
		o.LookupEnv = func(k string) (string, bool) { return runSecret, k == "GH_TOKEN" }
	})
	rep, err := runErr(t, s, sandbox.Request{Argv: []string{"env"}, Inject: []string{"gh"}})
	if errors.Is(err, errdefs.ErrNotSupported) {
		t.Skip("the credential package is not implemented here")
	}
	if err != nil {
		t.Fatalf("the run with the Service's own store: %v", err)
	}
	if !strings.Contains(rep.Stdout, credential.EndpointEnv+"=http://") {
		t.Errorf("the command's environment lacks %s:\n%s", credential.EndpointEnv, rep.Stdout)
	}
}
