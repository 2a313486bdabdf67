package bench

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// The credential series' servers, both on this host and both serving the
// same body at bodyPath: an HTTPS server for the alias's host, localhost
// on 127.0.0.1:443 (the endpoint always dials port 443), with a CA of its
// own; and a plain HTTP server for the proxy side in a network namespace
// of the bench's own, joined to this one by a veth pair in 198.18.0.0/15
// (RFC 2544's benchmarking range). The proxy side cannot be on loopback
// or on one of the host's addresses: the egress floor refuses those
// whatever the rules say.

const (
	bodyPath  = "/1mib"
	bodyBytes = 1 << 20
	// credHost is the alias's host; it resolves to 127.0.0.1 here.
	credHost = "localhost"
)

// benchBody is the 1 MiB both servers send: random, so that nothing on
// the way compresses it.
func benchBody() []byte {
	b := make([]byte, bodyBytes)
	rand.Read(b)
	return b
}

// bodyHandler serves body at bodyPath to requests carrying token as a
// bearer token ("" : any request).
func bodyHandler(body []byte, token string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token != "" && r.Header.Get("Authorization") != "Bearer "+token {
			http.Error(w, "unauthorised", http.StatusUnauthorized)
			return
		}
		if r.URL.Path != bodyPath {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(body))
	})
}

// tlsUpstream serves h over HTTPS on 127.0.0.1:443 for credHost with a
// fresh CA, whose certificate it writes to caFile. stop ends it.
func tlsUpstream(h http.Handler, caFile string) (stop func(), err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "isopod bench CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	leafTmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: credHost},
		DNSNames: []string{credHost}, NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err := x509.CreateCertificate(rand.Reader, leafTmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER}), 0o600); err != nil {
		return nil, err
	}
	cert := tls.Certificate{Certificate: [][]byte{leafDER}, PrivateKey: key}
	l, err := tls.Listen("tcp", "127.0.0.1:443", &tls.Config{Certificates: []tls.Certificate{cert}})
	if err != nil {
		return nil, fmt.Errorf("the alias's server needs 127.0.0.1:443 (the endpoint dials port 443): %w: %w", err, errdefs.ErrUnavailable)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(l)
	return func() { srv.Close() }, nil
}

// benchNet is the proxy side's namespace: its name, the veth's host end,
// and the server's address in it.
type benchNet struct {
	ns, hostIf string
	addr       string // the server's address, in the namespace
}

// newBenchNet makes a namespace joined to this one by a veth pair
// (198.18.N.1/30 here, 198.18.N.2/30 there). It needs root and ip(8).
func newBenchNet(ctx context.Context) (*benchNet, error) {
	if os.Geteuid() != 0 {
		return nil, fmt.Errorf("it makes a network namespace for the proxy side's server, which needs root: %w", errdefs.ErrFailedPrecondition)
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return nil, fmt.Errorf("it makes a network namespace with ip(8), not found: %w", errdefs.ErrFailedPrecondition)
	}
	id := os.Getpid() % 100000
	sub := id % 64 * 4 // a /30 of 198.18.0.0/24 from the pid
	n := &benchNet{ns: fmt.Sprintf("isopod-bench-%d", id), hostIf: fmt.Sprintf("ipb%dh", id),
		addr: fmt.Sprintf("198.18.0.%d", sub+2)}
	peer := fmt.Sprintf("ipb%dn", id)
	steps := [][]string{
		{"netns", "add", n.ns},
		{"link", "add", n.hostIf, "type", "veth", "peer", "name", peer, "netns", n.ns},
		{"addr", "add", fmt.Sprintf("198.18.0.%d/30", sub+1), "dev", n.hostIf},
		{"link", "set", n.hostIf, "up"},
		{"-n", n.ns, "addr", "add", n.addr + "/30", "dev", peer},
		{"-n", n.ns, "link", "set", peer, "up"},
		{"-n", n.ns, "link", "set", "lo", "up"},
	}
	for i, s := range steps {
		if out, err := exec.CommandContext(ctx, "ip", s...).CombinedOutput(); err != nil {
			if i > 0 {
				n.close()
			}
			return nil, fmt.Errorf("ip %v: %w: %s", s, err, bytes.TrimSpace(out))
		}
	}
	return n, nil
}

// listen opens a TCP listener on the server's address, port 80, inside
// the namespace: from a thread that enters it and is then discarded.
func (n *benchNet) listen() (net.Listener, error) {
	type result struct {
		l   net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		f, err := os.Open(filepath.Join("/run/netns", n.ns))
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("entering %s: %w", n.ns, err)}
			return
		}
		l, err := net.Listen("tcp", net.JoinHostPort(n.addr, "80"))
		ch <- result{l, err}
	}()
	r := <-ch
	return r.l, r.err
}

// close removes the namespace, and with it the veth pair.
func (n *benchNet) close() {
	exec.Command("ip", "netns", "del", n.ns).Run()
	exec.Command("ip", "link", "del", n.hostIf).Run() // gone with the namespace already, normally
}
