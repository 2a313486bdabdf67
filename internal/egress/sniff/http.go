// Package sniff reads the names a guest's connection carries: the
// server_name of a TLS ClientHello, and the Host of an HTTP request. The
// network paths of filtered egress (the userspace stack's ports 80 and
// 443, the proxies' tunnels) use it to have every name judged before
// anything the guest sent reaches a server.
package sniff

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"net/http"
	"strings"

	"isopod/internal/egress"
)

// ParseHTTPHost returns the host an HTTP/1 request that starts b is for:
// the authority of an absolute-form target, else the Host header, without
// a port. errNeedMore means the header block is not complete yet.
func ParseHTTPHost(b []byte) (string, error) {
	if i := bytes.IndexAny(b, " \r\n"); i == 0 || (i < 0 && len(b) > 32) {
		return "", errNotHTTP
	}
	for _, c := range b[:min(len(b), 16)] {
		if c == ' ' {
			break
		}
		if c < 'A' || c > 'Z' {
			return "", errNotHTTP
		}
	}
	if !bytes.Contains(b, []byte("\r\n\r\n")) {
		return "", errNeedMore
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(b)))
	if err != nil {
		return "", errNotHTTP
	}
	host := req.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.Trim(host, "[]"), nil
}

// NeedMore reports whether a parser error means "read more bytes".
func NeedMore(err error) bool { return errors.Is(err, errNeedMore) }

// HeadName reads the name a connection's first bytes are for: the SNI of a
// TLS ClientHello (from is egress.HostFromSNI), or the Host of an HTTP
// request (egress.HostFromHTTP). NeedMore(err) asks for more bytes; another
// error means the bytes are neither, and the name is then missing.
func HeadName(head []byte) (name, from string, err error) {
	if len(head) > 0 && head[0] == 0x16 {
		name, err = ParseClientHelloSNI(head)
		return name, egress.HostFromSNI, err
	}
	name, err = ParseHTTPHost(head)
	return name, egress.HostFromHTTP, err
}
