package fleet

import (
	"crypto/x509"
	"testing"

	"isopod/internal/testnet"
)

// makeCert writes a self-signed certificate for 127.0.0.1 and localhost
// and its key to dir.
func makeCert(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	return testnet.WritePEM(t, dir, testnet.SelfSigned(t, "127.0.0.1", "localhost"))
}

// x509Pool is a pool of the PEM certificates in b.
func x509Pool(t testing.TB, b []byte) *x509.CertPool {
	t.Helper()
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		t.Fatal("no certificate in the PEM")
	}
	return pool
}
