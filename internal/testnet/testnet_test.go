package testnet

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestRunPattern(t *testing.T) {
	for _, tt := range []struct{ in, want string }{
		{"TestA", "^TestA$"},
		{"TestA/sub_1", "^TestA$/^sub_1$"},
		{"TestA/x.y", `^TestA$/^x\.y$`},
	} {
		if got := runPattern(tt.in); got != tt.want {
			t.Errorf("runPattern(%q) = %q; want %q", tt.in, got, tt.want)
		}
	}
}

func TestBigBody(t *testing.T) {
	a, _ := io.ReadAll(BigBody(1000))
	b := make([]byte, 1000)
	r := BigBody(1000)
	for i := range b { // byte-wise reads must give the same stream
		if _, err := io.ReadFull(r, b[i:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	if string(a) != string(b) || len(a) != 1000 {
		t.Fatal("BigBody differs between read sizes")
	}
	if testing.Short() {
		return
	}
	h := sha256.New()
	io.Copy(h, BigBody(BigSize))
	if got := hex.EncodeToString(h.Sum(nil)); got != BigSHA256() {
		t.Errorf("BigSHA256 %s; recomputed %s", BigSHA256(), got)
	}
}

// get fetches path from addr with a connection made inside namespace ns.
func get(t *testing.T, n *Net, ns, addr, path string) (string, error) {
	t.Helper()
	c, err := n.Dial(ns, "tcp", addr, 3*time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: "+addr+"\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

func TestNet(t *testing.T) {
	n := New(t)
	for _, addr := range []string{PublicIP + ":80", Public2IP + ":80", LANIP + ":80", MetadataIP + ":80"} {
		ns := n.Public
		switch addr {
		case Public2IP + ":80":
			ns = n.Public2
		case LANIP + ":80":
			ns = n.LAN
		}
		n.ServeHTTP(t, ns, addr, nil)
	}
	for _, addr := range []string{PublicIP + ":80", Public2IP + ":80", LANIP + ":80", MetadataIP + ":80"} {
		body, err := get(t, n, n.Host, addr, HelloPath)
		if err != nil || body != HelloBody {
			t.Errorf("GET %s from the host namespace: %q, %v", addr, body, err)
		}
	}
	// An extra address reaches the namespace it was given to.
	if err := n.AddAddress(n.Public, "203.0.113.11"); err != nil {
		t.Fatal(err)
	}
	n.ServeHTTP(t, n.Public, "203.0.113.11:80", nil)
	if body, err := get(t, n, n.Host, "203.0.113.11:80", HelloPath); err != nil || body != HelloBody {
		t.Errorf("GET from an added address: %q, %v", body, err)
	}
	// The test servers speak HTTP/2 cleartext too.
	var h2 http.Protocols
	h2.SetUnencryptedHTTP2(true)
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{Protocols: &h2,
		DialContext: func(_ context.Context, network, addr string) (net.Conn, error) {
			return n.Dial(n.Host, network, addr, 3*time.Second)
		}}}
	if resp, err := c.Get("http://" + PublicIP + HelloPath); err != nil || resp.ProtoMajor != 2 {
		t.Errorf("GET over h2c: %v, %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if err := n.AddAddress(n.Host, "192.0.2.9"); err == nil {
		t.Error("AddAddress on the host namespace succeeded")
	}
	// Nothing outside the test network routes.
	start := time.Now()
	if c, err := n.Dial(n.Host, "tcp", "8.8.8.8:53", 3*time.Second); err == nil {
		c.Close()
		t.Error("dialled 8.8.8.8 from the test network")
	} else if time.Since(start) > 2*time.Second {
		t.Errorf("dial outside the test network took %v; want an immediate unreachable", time.Since(start))
	}
	// The host namespace's resolver is the test DNS server.
	out, err := n.Command(n.Host, "getent", "ahostsv4", "test.example").CombinedOutput()
	if err != nil || !strings.Contains(string(out), PublicIP) {
		t.Errorf("getent in the host namespace: %v: %s", err, out)
	}
	if n.DNSQueries() == 0 {
		t.Error("test DNS server saw no query")
	}
}

func TestRunSelf(t *testing.T) {
	if IsChild() {
		if out, err := exec.Command("ip", "-br", "addr").CombinedOutput(); err != nil || !strings.Contains(string(out), HostIP) {
			t.Fatalf("child not in the host namespace: %v: %s", err, out)
		}
		return
	}
	n := New(t)
	n.RunSelf(t, n.Host, time.Minute)
}
