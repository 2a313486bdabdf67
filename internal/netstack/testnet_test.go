package netstack

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
	"isopod/internal/testnet"
)

// TestStackInNamespace runs the stack in a test network's host namespace
// (re-executing this test there), with the default public-only policy, the
// namespace's resolver and real servers at documentation addresses.
func TestStackInNamespace(t *testing.T) {
	if testnet.IsChild() {
		stackInNamespaceChild(t)
		return
	}
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)
	n.ServeHTTP(t, n.Public, testnet.MetadataIP+":80", nil)
	n.ServeHTTP(t, n.Public2, testnet.Public2IP+":80", nil)
	n.ServeHTTP(t, n.LAN, testnet.LANIP+":80", nil)
	n.RunSelf(t, n.Host, 5*time.Minute)
}

// startInNS starts a stack with a log recorder in a fresh directory.
func startInNS(t *testing.T, allowLAN bool) (*Stack, *flightrec.Log) {
	t.Helper()
	dir := t.TempDir()
	rec, err := flightrec.Open(flightrec.Config{Path: filepath.Join(dir, "net.jsonl")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rec.Close() })
	hosts, err := HostAddrs()
	if err != nil {
		t.Fatal(err)
	}
	s, err := Start(Config{Socket: filepath.Join(dir, "net.sock"), Recorder: rec,
		Policy: &egress.PublicOnly{AllowLAN: allowLAN, HostAddrs: hosts}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, rec
}

func getBody(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// download fetches the big body and returns its hash and the rate.
func download(t *testing.T, c *http.Client, url string) (sum string, mibps float64) {
	t.Helper()
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	nb, err := io.Copy(h, resp.Body)
	if err != nil {
		t.Fatalf("download after %d bytes: %v", nb, err)
	}
	if nb != testnet.BigSize {
		t.Fatalf("downloaded %d bytes; want %d", nb, testnet.BigSize)
	}
	return hex.EncodeToString(h.Sum(nil)), float64(nb) / (1 << 20) / time.Since(start).Seconds()
}

func stackInNamespaceChild(t *testing.T) {
	// Things on the host that a guest must not reach: loopback and the host
	// namespace's own (public-range) address.
	for _, addr := range []string{"127.0.0.1:8099", testnet.HostIP + ":8099"} {
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		testnet.ServeBanner(t, l, "host service\n")
	}
	direct := &http.Client{Timeout: 2 * time.Minute}
	// Everything refused below is reachable from the host itself.
	for _, url := range []string{"http://169.254.169.254/hello", "http://192.168.77.10/hello"} {
		if body, err := getBody(direct, url); err != nil || body != testnet.HelloBody {
			t.Fatalf("direct GET %s: %q, %v (the test network is broken)", url, body, err)
		}
	}

	s, rec := startInNS(t, false)
	g := newTestGuest(t, s)
	client := g.httpClient()

	t.Run("dns", func(t *testing.T) {
		m, err := g.query("udp", "test.example", dns.TypeA)
		if err != nil || len(m.Answer) != 1 || m.Answer[0].(*dns.A).A.String() != testnet.PublicIP {
			t.Errorf("A test.example through the gateway: %v, %v", m, err)
		}
		m, err = g.query("tcp", "test.example", dns.TypeTXT)
		if err != nil || len(m.Answer) != 1 || !strings.Contains(m.Answer[0].String(), "isopod testnet") {
			t.Errorf("TXT test.example (relayed to the host's nameserver): %v, %v", m, err)
		}
		m, err = g.query("udp", "missing.example", dns.TypeA)
		if err != nil || m.Rcode != dns.RcodeNameError {
			t.Errorf("missing name: %v, %v; want NXDOMAIN", m, err)
		}
	})

	t.Run("http", func(t *testing.T) {
		for _, url := range []string{"http://203.0.113.10/hello", "http://198.51.100.10/hello"} {
			if body, err := getBody(client, url); err != nil || body != testnet.HelloBody {
				t.Errorf("GET %s through the stack: %q, %v", url, body, err)
			}
		}
	})

	t.Run("refused", func(t *testing.T) {
		for _, dst := range []string{"169.254.169.254:80", "192.168.77.10:80", testnet.HostIP + ":8099"} {
			g.mustRefuse(t, dst)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		if c, err := g.dial(ctx, "127.0.0.1:8099"); err == nil {
			c.Close()
			t.Error("reached the host's loopback through the stack")
		}
	})

	t.Run("throughput", func(t *testing.T) {
		url := "http://203.0.113.10" + testnet.BigPath
		sum, viaStack := download(t, client, url)
		if sum != testnet.BigSHA256() {
			t.Fatalf("download through the stack: sha256 %s; want %s", sum, testnet.BigSHA256())
		}
		_, viaHost := download(t, direct, url)
		t.Logf("throughput: 100 MiB through the stack %.0f MiB/s, direct from the host %.0f MiB/s, ratio %.2f",
			viaStack, viaHost, viaStack/viaHost)
	})

	client.CloseIdleConnections()
	sum := s.Summary()
	if err := s.Close(); err != nil {
		t.Error(err)
	}
	rec.Close()
	evs := readLog(t, rec.Path())
	for _, tt := range []struct {
		proto, dst string
		port       uint16
		reason     string
	}{
		{"tcp", "169.254.169.254", 80, egress.ReasonLinkLocal},
		{"tcp", "192.168.77.10", 80, egress.ReasonPrivate},
		{"tcp", testnet.HostIP, 8099, egress.ReasonHost},
		{"tcp", "127.0.0.1", 8099, egress.ReasonLoopback},
	} {
		ev := findEvent(evs, tt.proto, tt.dst, tt.port)
		if ev == nil || ev.Allowed || ev.Reason != tt.reason {
			t.Errorf("%s:%d: event %+v; want refused with %q", tt.dst, tt.port, ev, tt.reason)
		}
	}
	var big *flightrec.Event
	for i := range evs {
		if evs[i].Proto == "tcp" && evs[i].Dst.String() == testnet.PublicIP && evs[i].BytesDown > testnet.BigSize {
			big = &evs[i]
		}
	}
	if big == nil || !big.Allowed || big.Reason != egress.ReasonPublic {
		t.Errorf("no allowed flow with the big download's bytes in %d events", len(evs))
	}
	if sum.BytesDown < testnet.BigSize || sum.Denied < 4 {
		t.Errorf("summary %+v", sum)
	}

	t.Run("allow_lan", func(t *testing.T) {
		s, _ := startInNS(t, true)
		g := newTestGuest(t, s)
		c := g.httpClient()
		if body, err := getBody(c, "http://192.168.77.10/hello"); err != nil || body != testnet.HelloBody {
			t.Errorf("LAN host with AllowLAN: %q, %v", body, err)
		}
		for _, dst := range []string{"169.254.169.254:80", testnet.HostIP + ":8099"} {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			conn, err := g.dial(ctx, dst)
			cancel()
			if err == nil {
				conn.Close()
				t.Errorf("%s reachable with AllowLAN; must stay refused", dst)
			}
		}
	})
}
