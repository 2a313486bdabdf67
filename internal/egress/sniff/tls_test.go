package sniff

import (
	"testing"

	"isopod/internal/testnet"
)

func TestParseClientHelloSNI(t *testing.T) {
	for _, name := range []string{"allowed.example", "xn--bcher-kva.example"} {
		hello := testnet.ClientHello(t, name)
		got, err := ParseClientHelloSNI(hello)
		if err != nil || got != name {
			t.Errorf("SNI of a crypto/tls hello for %s: %q, %v", name, got, err)
		}
		// Every strict prefix asks for more; never a wrong answer.
		for i := 0; i < len(hello); i += max(1, len(hello)/40) {
			if n, err := ParseClientHelloSNI(hello[:i]); !NeedMore(err) {
				t.Fatalf("prefix of %d/%d bytes: %q, %v; want need-more", i, len(hello), n, err)
			}
		}
		// The same hello split over two TLS records.
		body := hello[5:]
		split := append([]byte{0x16, 0x03, 0x01, 0, 10}, body[:10]...)
		rest := body[10:]
		split = append(split, 0x16, 0x03, 0x01, byte(len(rest)>>8), byte(len(rest)))
		split = append(split, rest...)
		if got, err := ParseClientHelloSNI(split); err != nil || got != name {
			t.Errorf("hello over two records: %q, %v", got, err)
		}
	}
	// An IP-address server name is never sent as SNI.
	if got, err := ParseClientHelloSNI(testnet.ClientHello(t, "203.0.113.10")); err == nil {
		t.Errorf("hello to an address: SNI %q; want none", got)
	}
	for _, junk := range [][]byte{[]byte("GET / HTTP/1.1\r\n"), {0x16, 0x02, 0, 0, 1, 0}, {0x16, 0x03, 0x01, 0, 4, 2, 0, 0, 0}} {
		if _, err := ParseClientHelloSNI(junk); err == nil || NeedMore(err) {
			t.Errorf("junk %q: %v; want not TLS", junk, err)
		}
	}
}
