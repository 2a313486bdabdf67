package testnet

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"net"
	"testing"
	"time"
)

// ClientHello is the first TLS record a crypto/tls client sends for
// serverName (X25519 only, which keeps it small enough to paste into a
// guest's printf). An address as serverName gives a hello without SNI.
func ClientHello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	defer b.Close()
	go func() {
		c := tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true, CurvePreferences: []tls.CurveID{tls.X25519}})
		c.Handshake()
		a.Close()
	}()
	b.SetReadDeadline(time.Now().Add(5 * time.Second))
	hdr := make([]byte, 5) // content type, version, length
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatalf("reading the ClientHello record header: %v", err)
	}
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr)
	if _, err := io.ReadFull(b, rec[5:]); err != nil {
		t.Fatalf("reading the ClientHello record: %v", err)
	}
	return rec
}
