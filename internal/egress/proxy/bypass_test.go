package proxy

import (
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/testnet"
)

// rawExchange sends raw bytes to addr and returns all it reads until the
// proxy ends the connection.
func rawExchange(t *testing.T, addr string, send ...string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	for _, s := range send {
		io.WriteString(c, s)
	}
	b, _ := io.ReadAll(c)
	return string(b)
}

// socksHello is a SOCKS5 greeting and CONNECT request for host:port.
func socksHello(host string, port uint16) string {
	req := []byte{5, 1, 0, 5, 1, 0, 3, byte(len(host))}
	req = append(req, host...)
	return string(append(req, byte(port>>8), byte(port)))
}

// bypassCase is one attempt of TestProxyBypasses.
type bypassCase struct {
	name     string
	addr     string // "http" or "socks"
	send     []string
	reply    string   // a prefix of what the client reads after the proxy's own answer
	served   []string // Hosts the web server answers
	web, tls int32    // connections the servers accept
	records  []string // "proto host port reason allowed", in order
}

func bypassCases(t *testing.T) []bypassCase {
	const okReq = "GET /a HTTP/1.1\r\nHost: allowed.example\r\n\r\n"
	return []bypassCase{
		{"absolute form, Host elsewhere", "http", []string{"GET http://allowed.example/b HTTP/1.1\r\nHost: other.example\r\n\r\n"},
			"HTTP/1.1 403 Forbidden", nil, 0, 0, []string{"http_proxy other.example 80 host_mismatch false"}},
		{"absolute form, port out of range", "http", []string{"GET http://allowed.example:99999/ HTTP/1.1\r\nHost: allowed.example:99999\r\n\r\n"},
			"HTTP/1.1 400 Bad Request", nil, 0, 0, []string{"http_proxy allowed.example 0 bad_request false"}},
		{"absolute form, port zero", "http", []string{"GET http://allowed.example:0/ HTTP/1.1\r\n\r\n"},
			"HTTP/1.1 400 Bad Request", nil, 0, 0, []string{"http_proxy allowed.example 0 bad_request false"}},
		{"CONNECT, port out of range", "http", []string{"CONNECT allowed.example:99999 HTTP/1.1\r\n\r\n"},
			"HTTP/1.1 400 Bad Request", nil, 0, 0, []string{"http_proxy allowed.example 0 bad_request false"}},
		{"CONNECT, Host elsewhere", "http", []string{"CONNECT allowed.example:443 HTTP/1.1\r\nHost: other.example:443\r\n\r\n"},
			"HTTP/1.1 403 Forbidden", nil, 0, 0, []string{"http_proxy other.example 443 host_mismatch false"}},
		{"garbage", "http", []string{"GARBAGE\r\n\r\n"},
			"HTTP/1.1 400 Bad Request", nil, 0, 0, []string{"http_proxy <malformed> 0 bad_request false"}},
		{"smuggling head", "http", []string{"GET http://allowed.example/ HTTP/1.1\r\nHost: allowed.example\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n"},
			"HTTP/1.1 400 Bad Request", nil, 0, 0, []string{"http_proxy <malformed> 0 malformed false"}},
		{"CONNECT 80, request line and Host disagree", "http", []string{"CONNECT allowed.example:80 HTTP/1.1\r\n\r\n",
			"GET http://allowed.example/b HTTP/1.1\r\nHost: other.example\r\n\r\n"},
			"HTTP/1.1 403 Forbidden", nil, 0, 0, []string{"http_proxy other.example 80 host_mismatch false"}},
		{"CONNECT 80, pipelined", "http", []string{"CONNECT allowed.example:80 HTTP/1.1\r\n\r\n", okReq,
			"GET /b HTTP/1.1\r\nHost: other.example\r\n\r\n"},
			"HTTP/1.1 200 OK", []string{"allowed.example"}, 1, 0,
			[]string{"http_proxy other.example 80 host_mismatch false", "http_proxy allowed.example 80 allowed_host true"}},
		{"CONNECT 443, SNI elsewhere", "http", []string{"CONNECT allowed.example:443 HTTP/1.1\r\n\r\n", string(testnet.ClientHello(t, "other.example"))},
			"", nil, 0, 0, []string{"http_proxy other.example 443 sni_mismatch false"}},
		{"CONNECT 443, no SNI", "http", []string{"CONNECT allowed.example:443 HTTP/1.1\r\n\r\n", string(testnet.ClientHello(t, "203.0.113.10"))},
			"", nil, 0, 0, []string{"http_proxy allowed.example 443 sni_mismatch false"}},
		{"CONNECT 8080, HTTP elsewhere", "http", []string{"CONNECT allowed.example:8080 HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\nHost: other.example\r\n\r\n"},
			"", nil, 1, 0, []string{"http_proxy other.example 8080 host_mismatch false", "http_proxy allowed.example 8080 allowed_host true"}},
		{"SOCKS 80, Host elsewhere", "socks", []string{socksHello("allowed.example", 80), "GET /b HTTP/1.1\r\nHost: other.example\r\n\r\n"},
			"HTTP/1.1 403 Forbidden", nil, 0, 0, []string{"socks5 other.example 80 host_mismatch false"}},
		{"SOCKS 80, kept alive", "socks", []string{socksHello("allowed.example", 80), okReq, okReq,
			"GET http://other.example/ HTTP/1.1\r\nHost: allowed.example\r\n\r\n"},
			"HTTP/1.1 200 OK", []string{"allowed.example", "allowed.example"}, 1, 0,
			[]string{"socks5 other.example 80 host_mismatch false", "socks5 allowed.example 80 allowed_host true"}},
		{"SOCKS 443, SNI elsewhere", "socks", []string{socksHello("allowed.example", 443), string(testnet.ClientHello(t, "other.example"))},
			"", nil, 0, 0, []string{"socks5 other.example 443 sni_mismatch false"}},
		{"SOCKS port zero", "socks", []string{socksHello("allowed.example", 0)},
			"", nil, 0, 0, []string{"socks5 allowed.example 0 bad_request false"}},
	}
}

// TestProxyBypasses: every name a request carries must be the one it asks
// for, for every request in a tunnel; refusals reach no server and leave
// exactly one record each.
func TestProxyBypasses(t *testing.T) {
	fx := newFixture(t)
	tests := bypassCases(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			web0, tls0, served0 := fx.webConns.Load(), fx.tlsConns.Load(), len(fx.served())
			addr := fx.httpAddr
			if tt.addr == "socks" {
				addr = fx.socksAddr
			}
			got := rawExchange(t, addr, tt.send...)
			if tt.addr == "socks" && len(got) >= 12 {
				got = got[12:] // the method choice and the CONNECT reply
			} else if rest, ok := strings.CutPrefix(got, "HTTP/1.1 200 Connection established\r\n\r\n"); ok {
				got = rest
			}
			if !strings.HasPrefix(got, tt.reply) || strings.Contains(got, "other.example") || strings.Contains(got, "\x16\x03") {
				t.Errorf("client read %q; want it to start %q, nothing from the server for other.example", got, tt.reply)
			}
			fx.rec.Wait(len(tt.records))
			time.Sleep(20 * time.Millisecond) // and no more than those
			evs := fx.rec.Reset()
			var recs []string
			for _, ev := range evs {
				recs = append(recs, fmt.Sprintf("%s %s %d %s %v", ev.Proto, egress.RecordHost(ev.Host), ev.Port, ev.Reason, ev.Allowed))
			}
			if strings.Join(recs, "\n") != strings.Join(tt.records, "\n") {
				t.Errorf("records:\n%s\nwant:\n%s", strings.Join(recs, "\n"), strings.Join(tt.records, "\n"))
			}
			if served := fx.served()[served0:]; strings.Join(served, ",") != strings.Join(tt.served, ",") {
				t.Errorf("web server answered %q; want %q", served, tt.served)
			}
			if web, tls := fx.webConns.Load()-web0, fx.tlsConns.Load()-tls0; web != tt.web || tls != tt.tls {
				t.Errorf("servers accepted %d (web) and %d (TLS) connections; want %d and %d", web, tls, tt.web, tt.tls)
			}
		})
	}
}
