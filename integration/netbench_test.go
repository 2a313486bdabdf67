package integration

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"isopod/internal/testnet"
)

// TestNetworkThroughputRatio measures a 100 MiB download from a test host
// through a guest's network stack and, side by side, the same download on
// the host itself. It reports figures; it asserts only correctness (speed
// targets live in BENCHMARKS.md, not in tests). Run it with
// ISOPOD_BENCH=1 go test -run TestNetworkThroughputRatio -v ./integration/
func benchEnabled() bool { return os.Getenv("ISOPOD_BENCH") == "1" }

func TestNetworkThroughputRatio(t *testing.T) {
	requireVM(t)
	if !benchEnabled() {
		t.Skip("a benchmark: set ISOPOD_BENCH=1")
	}
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)
	url := "http://" + testnet.PublicIP + testnet.BigPath

	for i := 0; i < 3; i++ {
		// On the host (inside the test host's namespace).
		start := time.Now()
		c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(n.Host, network, addr, 10*time.Second)
		}}}
		resp, err := c.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		host := time.Since(start)
		// In a guest: time the download alone, inside the guest.
		r := nsRun(t, n, "--timeout-s", "600", "--", "sh", "-c",
			"s=$(date +%s%N); wget -q -O /dev/null "+url+"; e=$(date +%s%N); echo $(( (e - s) / 1000000 ))")
		guestMS := strings.TrimSpace(str(r.JSON, "stdout"))
		t.Logf("100 MiB: host %d bytes in %v (%.0f MiB/s); guest %s ms; guest total_ms %d",
			got, host, 100/host.Seconds(), guestMS, num(t, r.JSON, "total_ms"))
	}
}
