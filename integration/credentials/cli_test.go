package credentials

import (
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// guestScript uses the endpoint directly and through the HTTP proxy
// (busybox wget ignores no_proxy), asks for a path the alias does not
// allow, tries the pinned host through the proxy and the gateway's DNS,
// and then looks for the secret in the guest's environment, files and
// process environments.
const guestScript = `EP=$ISOPOD_CREDENTIAL_ENDPOINT
echo "ep=$EP"
echo "direct=$(http_proxy= HTTP_PROXY= wget -q -O- $EP/up/ok/direct)"
echo "proxied=$(wget -q -O- $EP/up/ok/proxied)"
wget -q -O- $EP/up/no/x >/dev/null 2>&1; echo "refused=$?"
no_proxy= NO_PROXY= wget -q -O- http://localhost:443/ >/dev/null 2>&1; echo "pinnedproxy=$?"
nslookup localhost 10.0.2.1 >/dev/null 2>&1; echo "pinneddns=$?"
` + secretProbe

// secretProbe joins the secret's halves from A and B and looks for it in
// the guest's environment, files and process environments.
const secretProbe = `s="$A$B"; unset A B
echo "envhits=$(env | grep -c "$s")"
find / \( -path /proc -o -path /sys -o -path /dev \) -prune -o -type f -exec grep -l "$s" {} + 2>/dev/null | sed 's/^/filehit=/'
echo "procenv=$(cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c "$s")"
echo done`

// TestInjectRun: the guest reaches the upstream through the endpoint,
// both ways, with the secret the host adds; what the alias does not
// allow and the pinned host are refused and recorded; the secret is in
// no guest file, environment or process, nor in the report, the logs or
// any file of the state root, a committed stage included.
func TestInjectRun(t *testing.T) {
	e2e.RequireVM(t)
	up := startUpstream(t)
	writeStore(t, up, 0o600, map[string]string{"up": upAlias})
	start := time.Now()
	env := []string{tokenEnv + "=" + secret}
	args := []string{"run", "--inject", "up", "--timeout-s", "600", "--commit-as", "cred-e2e/probe", "--env", "A=" + secretA, "--env", "B=" + secretB,
		"--", "sh", "-c", guestScript}
	r := e2e.Isopod(t, env, args...)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run --inject:\n%s", r)
	}
	out := e2e.Str(r.JSON, "stdout")
	for _, want := range []string{"ep=http://10.0.2.1:3129\n", "direct=upstream:/ok/direct\n", "proxied=upstream:/ok/proxied\n",
		"refused=1\n", "pinnedproxy=1\n", "envhits=0\n", "procenv=0\n", "done\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("guest output lacks %q:\n%s\nstderr: %s", want, out, e2e.Str(r.JSON, "stderr"))
		}
	}
	if strings.Contains(out, "pinneddns=0") {
		t.Errorf("the gateway's resolver answered for the pinned host:\n%s", out)
	}
	if strings.Contains(out, "filehit=") {
		t.Errorf("the secret is in guest files:\n%s", out)
	}
	checkEgress(t, r.JSON)
	if e2e.Str(r.JSON, "stage_id") == "" {
		t.Errorf("no stage committed: %v", r.JSON["commit_error"])
	}
	for _, where := range [][]byte{r.Stdout, r.Stderr} {
		if strings.Contains(string(where), secret) {
			t.Error("the secret is in isopod's output")
		}
	}
	if hits := filesHolding(t, e2e.HomeDir, start, []byte(secret)); len(hits) > 0 {
		t.Errorf("the secret is in the state root: %v", hits)
	}
}

// checkEgress: the report's egress block names the alias and the
// endpoint, lists the endpoint's requests (allowed and refused) and the
// pinned host's refusals.
func checkEgress(t *testing.T, rep map[string]any) {
	t.Helper()
	eg, _ := rep["egress"].(map[string]any)
	if eg == nil {
		t.Fatalf("no egress block: %v", rep)
	}
	if inj, _ := eg["injected"].([]any); len(inj) != 1 || inj[0] != "up" || eg["credential_endpoint"] != "http://10.0.2.1:3129" {
		t.Errorf("egress injected %v, credential_endpoint %v", eg["injected"], eg["credential_endpoint"])
	}
	count := func(list, proto, reason string) int {
		n := 0
		evs, _ := eg[list].([]any)
		for _, e := range evs {
			ev, _ := e.(map[string]any)
			if (proto == "" || ev["proto"] == proto) && (reason == "" || ev["reason"] == reason) {
				n++
			}
		}
		return n
	}
	if n := count("allowed", "credential", ""); n != 2 {
		t.Errorf("%d allowed endpoint requests recorded; want 2: %v", n, eg["allowed"])
	}
	if n := count("denied", "credential", "credential_refused"); n != 1 {
		t.Errorf("%d refused endpoint requests recorded; want 1: %v", n, eg["denied"])
	}
	for _, proto := range []string{"http_proxy", "dns"} {
		if count("denied", proto, "pinned_credential_host") == 0 {
			t.Errorf("no %s refusal of the pinned host recorded: %v", proto, eg["denied"])
		}
	}
}

// TestInjectRefusedBeforeBoot: a store others can read, an alias whose
// source is not set, an unknown alias, and --inject with --no-network are
// refused before any VM starts, each naming the problem.
func TestInjectRefusedBeforeBoot(t *testing.T) {
	e2e.RequireVM(t)
	env := []string{tokenEnv + "=" + secret}
	for _, tt := range []struct {
		name   string
		perm   uint32
		alias  string
		args   []string
		env    []string
		class  string
		naming string
	}{
		{"store readable by others", 0o644, upAlias, []string{"--inject", "up"}, env, "failed_precondition", "credentials.json"},
		{"source not set", 0o600, upAlias, []string{"--inject", "up"}, nil, "failed_precondition", tokenEnv},
		{"unknown alias", 0o600, upAlias, []string{"--inject", "nope"}, env, "not_found", "nope"},
		{"no network", 0o600, upAlias, []string{"--inject", "up", "--no-network"}, env, "invalid_argument", "--no-network"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			writeStore(t, nil, fsMode(tt.perm), map[string]string{"up": tt.alias})
			before := vmCount(t)
			r := e2e.Isopod(t, tt.env, append(append([]string{"run"}, tt.args...), "--", "true")...)
			msg, _ := r.JSON["error"].(string)
			if r.Code != 1 || r.JSON["class"] != tt.class || !strings.Contains(msg, tt.naming) {
				t.Errorf("exit %d class %v error %q; want %s naming %q", r.Code, r.JSON["class"], msg, tt.class, tt.naming)
			}
			if strings.Contains(string(r.Stdout)+string(r.Stderr), secret) {
				t.Error("the refusal holds the secret")
			}
			if after := vmCount(t); after != before {
				t.Errorf("%d VM records before, %d after: a VM started", before, after)
			}
		})
	}
}

// TestInjectRunCurl: curl, which honours NO_PROXY, reaches the endpoint
// directly; https://localhost/ through the proxy is refused as the pinned
// host.
func TestInjectRunCurl(t *testing.T) {
	e2e.RequireVM(t)
	e2e.RequireDebian(t)
	up := startUpstream(t)
	writeStore(t, up, 0o600, map[string]string{"up": upAlias})
	r := e2e.Isopod(t, []string{tokenEnv + "=" + secret}, "run", "--base", "base-debian", "--inject", "up", "--timeout-s", "600", "--",
		"sh", "-c", `echo "curl=$(curl -s $ISOPOD_CREDENTIAL_ENDPOINT/up/ok/curl)"; curl -s --noproxy '' https://localhost/ ; echo "pinned=$?"`)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run --inject:\n%s", r)
	}
	out := e2e.Str(r.JSON, "stdout")
	if !strings.Contains(out, "curl=upstream:/ok/curl\n") || strings.Contains(out, "pinned=0") {
		t.Errorf("guest output:\n%s\nstderr: %s", out, e2e.Str(r.JSON, "stderr"))
	}
	eg, _ := r.JSON["egress"].(map[string]any)
	denied, _ := eg["denied"].([]any)
	found := false
	for _, e := range denied {
		ev, _ := e.(map[string]any)
		found = found || (ev["host"] == "localhost" && ev["reason"] == "pinned_credential_host" && ev["port"] == float64(443))
	}
	if !found {
		t.Errorf("no pinned_credential_host refusal of localhost:443 recorded: %v", denied)
	}
}

// TestInjectBodyCap: ISOPOD_CREDENTIAL_MAX_BODY_MIB caps what a guest may
// send through the endpoint: a body under it reaches the host, one over it
// gets 413 and is recorded as body_too_large.
func TestInjectBodyCap(t *testing.T) {
	e2e.RequireVM(t)
	e2e.RequireDebian(t)
	up := startUpstream(t)
	writeStore(t, up, 0o600, map[string]string{"up": `{"host": "localhost", "scheme": "bearer", "source": "env:` + tokenEnv +
		`", "ca_file": "%CA%", "allow": ["POST /ok/**"]}`})
	env := []string{tokenEnv + "=" + secret, "ISOPOD_CREDENTIAL_MAX_BODY_MIB=1"}
	script := `head -c 524288 /dev/zero > /tmp/small; head -c 2097152 /dev/zero > /tmp/big
echo "small=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @/tmp/small $ISOPOD_CREDENTIAL_ENDPOINT/up/ok/small)"
echo "big=$(curl -s -o /dev/null -w '%{http_code}' --data-binary @/tmp/big $ISOPOD_CREDENTIAL_ENDPOINT/up/ok/big)"`
	r := e2e.Isopod(t, env, "run", "--base", "base-debian", "--inject", "up", "--timeout-s", "600", "--", "sh", "-c", script)
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run --inject:\n%s", r)
	}
	out := e2e.Str(r.JSON, "stdout")
	if !strings.Contains(out, "small=200\n") || !strings.Contains(out, "big=413\n") {
		t.Errorf("guest output:\n%s\nstderr: %s", out, e2e.Str(r.JSON, "stderr"))
	}
	eg, _ := r.JSON["egress"].(map[string]any)
	denied, _ := eg["denied"].([]any)
	found := false
	for _, e := range denied {
		ev, _ := e.(map[string]any)
		found = found || (ev["note"] == "body_too_large" && ev["reason"] == "credential_refused")
	}
	if !found {
		t.Errorf("no body_too_large refusal recorded: %v", denied)
	}
}
