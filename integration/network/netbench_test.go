package network

import (
	"isopod/integration/e2e"

	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"isopod/internal/testnet"
)

func TestNetworkThroughputRatio(t *testing.T) {
	e2e.RequireVM(t)
	if !e2e.BenchEnabled() {
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
		r := nsRun(t, n, "--timeout-s", "600", "--", "sh", "-c", "time wget -q -O /dev/null "+url)
		if got != testnet.BigSize {
			t.Fatalf("host download: %d bytes; want %d", got, testnet.BigSize)
		}
		netb, _ := r.JSON["net"].(map[string]any)
		if e2e.Num(t, r.JSON, "exit_code") != 0 || netb["bytes_down"].(float64) < testnet.BigSize {
			t.Fatalf("guest download failed or fell short:\n%s", r)
		}
		guest := strings.TrimSpace(strings.ReplaceAll(e2e.Str(r.JSON, "stderr"), "\n", " "))
		t.Logf("100 MiB: host %d bytes in %v (%.0f MiB/s); guest: %s; guest total_ms %d (path %s)",
			got, host, 100/host.Seconds(), guest, e2e.Num(t, r.JSON, "total_ms"), e2e.Str(r.JSON, "path"))
	}
}
