package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
)

// The credential series: inside one filtered base-debian VM, a 1 MiB GET
// through the credential endpoint (guest plain HTTP to the gateway, the
// host's HTTPS request to the alias's host) against a 1 MiB plain HTTP GET
// of the same bytes through the gateway's HTTP proxy, interleaved, each
// timed by curl's time_total in the guest after one warm-up request each.

// credAlias is the bench's alias in its own temporary store.
const credAlias = "bench"

// credentialSeries measures the pair and records credential_get_1mib,
// proxy_get_1mib and their ratio in res; when this host cannot take it
// (not root, port 443 taken, no base-debian), it records why in
// res.Extra["credential_skipped"] and measures nothing.
func (b *bench) credentialSeries(ctx context.Context, n int, newService func(store string) (*sandbox.Service, error), res *Result) error {
	cred, proxy, err := b.credentialSamples(ctx, n, newService)
	var skip *skipError
	if errors.As(err, &skip) {
		b.log.Warn("bench: credential series skipped", "why", skip.Error())
		res.Extra["credential_skipped"] = skip.Error()
		return nil
	}
	if err != nil {
		return fmt.Errorf("bench credential: %w", err)
	}
	res.Series["credential_get_1mib"], res.Series["proxy_get_1mib"] = stats(cred), stats(proxy)
	res.Ratios["credential_over_proxy"] = ratio(res.Series["credential_get_1mib"].P50, res.Series["proxy_get_1mib"].P50)
	if res.Accel == "" {
		res.Accel = b.accel
	}
	res.Extra["credential_timing"] = "curl time_total in one base-debian VM, the two GETs interleaved, after one warm-up each"
	return nil
}

// skipError is why this host cannot take the credential series.
type skipError struct{ err error }

func (e *skipError) Error() string { return "the credential series cannot run here: " + e.err.Error() }
func (e *skipError) Unwrap() error { return e.err }

// credentialSamples sets up both servers, a store of the bench's own and
// a Service over it, runs the VM and returns the samples in ms.
func (b *bench) credentialSamples(ctx context.Context, n int, newService func(store string) (*sandbox.Service, error)) (cred, proxy []float64, err error) {
	if newService == nil {
		return nil, nil, &skipError{fmt.Errorf("the front end gave no way to make a Service over the bench's own credential store: %w", errdefs.ErrFailedPrecondition)}
	}
	dir, err := os.MkdirTemp("", "isopod-bench-cred-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(dir)
	body, token := benchBody(), randomToken()
	store, err := writeBenchStore(dir, token)
	if err != nil {
		return nil, nil, err
	}
	stop, err := tlsUpstream(bodyHandler(body, token), filepath.Join(dir, "ca.pem"))
	if err != nil {
		return nil, nil, &skipError{err}
	}
	defer stop()
	bn, err := newBenchNet(ctx)
	if err != nil {
		return nil, nil, &skipError{err}
	}
	defer bn.close()
	l, err := bn.listen()
	if err != nil {
		return nil, nil, fmt.Errorf("the proxy side's server: %w", err)
	}
	srv := &http.Server{Handler: bodyHandler(body, ""), ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	defer srv.Close()

	s, err := newService(store)
	if err != nil {
		return nil, nil, err
	}
	defer s.Close()
	rep, err := s.Run(ctx, sandbox.Request{Argv: []string{"sh", "-c", credScript(n, bn.addr)}, Base: "base-debian",
		Inject: []string{credAlias}, AllowCIDRs: []string{bn.addr + "/32"}, TimeoutS: 600})
	if err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrFailedPrecondition) {
			return nil, nil, &skipError{fmt.Errorf("it runs curl on base-debian: %w", err)}
		}
		return nil, nil, err
	}
	if rep.ExitCode == nil || *rep.ExitCode != 0 {
		return nil, nil, fmt.Errorf("the guest's GETs failed: %s", rep.Stderr)
	}
	b.accel = string(rep.Accel)
	return parseCredSamples(rep.Stdout, n)
}

// credScript is the guest's loop: a warm-up of each side, then n pairs,
// their order alternating, each line "sample <endpoint s> <proxy s>".
// curl fails the script on an HTTP error or a body of another size.
func credScript(n int, proxyAddr string) string {
	return fmt.Sprintf(`set -e
ep="$ISOPOD_CREDENTIAL_ENDPOINT/%[1]s%[2]s"
px="http://%[3]s%[2]s"
get() { # URL [proxy]
	if [ -n "$2" ]; then out=$(curl -fsS -o /dev/null -w '%%{size_download} %%{time_total}' -x "$2" "$1")
	else out=$(curl -fsS -o /dev/null -w '%%{size_download} %%{time_total}' --noproxy '*' "$1"); fi
	[ "${out%%%% *}" = %[4]d ] || { echo "got $out from $1" >&2; exit 1; }
	echo "${out#* }"
}
get "$ep" >/dev/null; get "$px" "$http_proxy" >/dev/null
i=0
while [ $i -lt %[5]d ]; do
	if [ $((i %% 2)) = 0 ]; then c=$(get "$ep"); p=$(get "$px" "$http_proxy")
	else p=$(get "$px" "$http_proxy"); c=$(get "$ep"); fi
	echo "sample $c $p"
	i=$((i + 1))
done`, credAlias, bodyPath, proxyAddr, bodyBytes, n)
}

// parseCredSamples reads the script's sample lines, in seconds, as ms.
func parseCredSamples(stdout string, n int) (cred, proxy []float64, err error) {
	for _, line := range strings.Split(stdout, "\n") {
		f := strings.Fields(line)
		if len(f) != 3 || f[0] != "sample" {
			continue
		}
		c, err1 := strconv.ParseFloat(f[1], 64)
		p, err2 := strconv.ParseFloat(f[2], 64)
		if err := errors.Join(err1, err2); err != nil {
			return nil, nil, fmt.Errorf("the guest's sample %q: %w", line, err)
		}
		cred, proxy = append(cred, secondsToMS(c)), append(proxy, secondsToMS(p))
	}
	if len(cred) != n {
		return nil, nil, fmt.Errorf("the guest gave %d samples, not %d: %q", len(cred), n, stdout)
	}
	return cred, proxy, nil
}

// writeBenchStore writes the store of the bench's alias, for credHost with
// the CA in dir/ca.pem and the token read from dir/token, allowed GET of
// bodyPath only, and returns its path.
func writeBenchStore(dir, token string) (string, error) {
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token), 0o600); err != nil {
		return "", err
	}
	store := filepath.Join(dir, "credentials.json")
	body := fmt.Sprintf(`{"version": 1, "credentials": {%q: {"host": %q, "scheme": "bearer", "source": "file:%s", "ca_file": %q, "allow": ["GET %s"]}}}`,
		credAlias, credHost, tokenFile, filepath.Join(dir, "ca.pem"), bodyPath)
	return store, os.WriteFile(store, []byte(body), 0o600)
}

// randomToken is a fresh secret for the bench's alias.
func randomToken() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// secondsToMS converts curl's seconds (microsecond resolution) to ms.
func secondsToMS(s float64) float64 { return math.Round(s*1e6) / 1e3 }
