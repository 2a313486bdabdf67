package images

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"isopod/integration/e2e"
	"isopod/internal/image"
	"isopod/internal/testnet"
)

var (
	buildOnce sync.Once
	buildErr  string
)

// requireBaseMin builds base-min in the test binary's private home unless
// the installed one is already this isopod's (a build publishes by rename,
// so the user's own image is left alone), and checks that it holds the
// pinned busybox.
func requireBaseMin(t *testing.T) {
	t.Helper()
	e2e.RequireVM(t)
	buildOnce.Do(func() {
		r := e2e.Isopod(t, nil, "image", "build", image.FlavorBaseMin)
		if r.Code != 0 {
			buildErr = r.String()
		}
	})
	if buildErr != "" {
		t.Fatalf("building base-min:\n%s", buildErr)
	}
	b, err := os.ReadFile(filepath.Join(e2e.HomeDir, "images", "base-min.json"))
	if err != nil {
		t.Fatal(err)
	}
	var info image.BaseInfo
	if err := json.Unmarshal(b, &info); err != nil || len(info.Inputs) != 1 || info.Inputs[0] != image.BusyboxPin {
		t.Fatalf("base-min.json inputs %+v (%v); want only %+v", info.Inputs, err, image.BusyboxPin)
	}
}

// lines maps each "key=value" line of out to its value.
func lines(out string) map[string]string {
	m := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if k, v, ok := strings.Cut(l, "="); ok {
			m[k] = v
		}
	}
	return m
}

// appletScript exercises, inside one guest and over its loopback, the
// applets agents use. Each check prints one "name=exit-status output" line.
const appletScript = `
busybox | head -n 1 | sed 's/^/version=/'
cd /tmp && mkdir -p www && printf 'served by httpd\n' > www/index.html
httpd -f -p 127.0.0.1:8080 -h www </dev/null >/dev/null 2>&1 & hpid=$!
i=0; while ! nc -z 127.0.0.1 8080 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
out=$(wget -T 5 -q -O - http://127.0.0.1:8080/index.html 2>&1); echo "wget=$? $out"
kill $hpid; wait $hpid 2>/dev/null
nc -l -p 9000 > nc.out & npid=$!
i=0; while ! netstat -ltn 2>/dev/null | grep -q ':9000 ' && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
echo ping-over-nc | nc -w 1 127.0.0.1 9000; echo "nc=$?"
wait $npid; echo "nclisten=$? $(cat nc.out)"
start=$(date +%s); timeout 1 sleep 30; rc=$?; echo "timeout=$rc $(( $(date +%s) - start ))"
timeout 5 true; echo "timeoutok=$?"
mkdir -p t/src/d && printf 'one\n' > t/src/d/a && printf 'two\n' > t/src/b
tar -C t/src -czf t/x.tgz . && mkdir t/dst && tar -C t/dst -xzf t/x.tgz; echo "tar=$? $(cat t/dst/d/a t/dst/b | tr '\n' ' ')"
out=$(printf abc | sha256sum); echo "sha256sum=$? $out"
`

// TestBaseMinApplets boots base-min without a network and runs wget -T (a
// crash of bookworm's busybox 1.35), nc, timeout, tar and sha256sum.
func TestBaseMinApplets(t *testing.T) {
	requireBaseMin(t)
	r := e2e.Run(t, "--no-network", "--timeout-s", "120", "--", "sh", "-c", appletScript)
	got := lines(e2e.Str(r.JSON, "stdout"))
	tests := []struct{ key, want string }{
		{"version", "(Debian " + image.BusyboxPin.Version + ")"},
		{"wget", "0 served by httpd"},
		{"nc", "0"},
		{"nclisten", "0 ping-over-nc"},
		{"timeoutok", "0"},
		{"tar", "0 one two "},
		{"sha256sum", "0 ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad  -"},
	}
	for _, tt := range tests {
		if v, ok := got[tt.key]; !ok || !strings.Contains(v, tt.want) {
			t.Errorf("%s: got %q; want %q (exit status first; 139 is a crash)", tt.key, v, tt.want)
		}
	}
	// busybox timeout ends the command with SIGTERM: status 128+15, after
	// about a second rather than the thirty the command asked for.
	if v := got["timeout"]; v != "143 1" && v != "143 2" {
		t.Errorf("timeout: got %q; want \"143 1\" (status, seconds taken)", v)
	}
	if t.Failed() {
		t.Logf("guest output:\n%s\nstderr:\n%s", e2e.Str(r.JSON, "stdout"), e2e.Str(r.JSON, "stderr"))
	}
}

// TestBaseMinNetworkApplets runs nslookup against the guest's resolver and
// wget -T and nc against a server in a test network namespace, through
// isopod's network stack.
func TestBaseMinNetworkApplets(t *testing.T) {
	requireBaseMin(t)
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)
	script := `
nslookup test.example > ns.out 2>&1; echo "nslookup=$? $(grep -c '` + testnet.PublicIP + `' ns.out)"
out=$(wget -T 5 -q -O - http://test.example` + testnet.HelloPath + ` 2>&1); echo "wget=$? $out"
out=$(printf 'GET ` + testnet.HelloPath + ` HTTP/1.0\r\nHost: test.example\r\n\r\n' | nc -w 5 test.example 80 | tail -n 1); echo "nc=$? $out"
`
	r := e2e.NSIsopod(t, n, "run", "--timeout-s", "120", "--", "sh", "-c", script)
	if r.Code != 0 {
		t.Fatalf("isopod run:\n%s", r)
	}
	got := lines(e2e.Str(r.JSON, "stdout"))
	body := strings.TrimSuffix(testnet.HelloBody, "\n")
	for _, tt := range []struct{ key, want string }{
		{"nslookup", "0 1"},
		{"wget", "0 " + body},
		{"nc", "0 " + body},
	} {
		if v := got[tt.key]; v != tt.want {
			t.Errorf("%s: got %q; want %q (exit status first; 139 is a crash)", tt.key, v, tt.want)
		}
	}
	if t.Failed() {
		t.Logf("guest output:\n%s\nstderr:\n%s", e2e.Str(r.JSON, "stdout"), e2e.Str(r.JSON, "stderr"))
	}
}
