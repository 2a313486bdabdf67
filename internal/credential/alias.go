package credential

import (
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"

	"golang.org/x/net/http/httpguts"

	"isopod/internal/egress"
)

// alias validates one declaration, named name (lower case). Its errors
// name the field and the fix, never a secret (the store holds none).
func (af aliasFile) alias(name string) (Alias, error) {
	host, err := checkHost(af.Host)
	if err != nil {
		return Alias{}, fmt.Errorf(`"host": %w`, err)
	}
	a := Alias{Name: name, Host: host, Scheme: Scheme(af.Scheme), User: af.User, Header: af.Header,
		Source: af.Source, MCP: af.MCP, CAFile: af.CAFile}
	if err := a.checkScheme(); err != nil {
		return Alias{}, err
	}
	if err := checkSource(af.Source); err != nil {
		return Alias{}, fmt.Errorf(`"source": %w`, err)
	}
	if a.Allow, err = parseAllow(af.Allow); err != nil {
		return Alias{}, fmt.Errorf(`"allow": %w`, err)
	}
	if af.CAFile != "" {
		if a.caPEM, err = readCA(af.CAFile); err != nil {
			return Alias{}, fmt.Errorf(`"ca_file": %w`, err)
		}
	}
	return a, nil
}

// checkHost normalises a credential's host: one exact DNS name (lower
// case, no trailing dot), no wildcard, port or address, and nothing a
// URL parser would read as an IPv4 address (a last label of digits, or
// 0x and hex digits: 2852039166, 127.1, 0xa9fea9fe, api.123).
func checkHost(h string) (string, error) {
	if h == "" {
		return "", fmt.Errorf("missing: name the one host the secret is sent to, e.g. api.github.com")
	}
	if strings.ContainsAny(h, "*:/[]@") {
		return "", fmt.Errorf("%q is not one exact host name (no wildcard, port, path or address): name the host alone", h)
	}
	n, err := egress.NormalizeHost(h)
	if err != nil {
		return "", fmt.Errorf("%q: %v: name the host alone", h, err)
	}
	last := n[strings.LastIndexByte(n, '.')+1:]
	if numeric(last) {
		return "", fmt.Errorf("%q ends in a number, which URL parsers read as an IPv4 address: name the host by a DNS name", h)
	}
	return n, nil
}

// numeric reports whether a label is a number as the WHATWG URL parser's
// IPv4 parser reads one: decimal digits, or 0x followed by hex digits.
func numeric(label string) bool {
	if rest, ok := strings.CutPrefix(label, "0x"); ok {
		return strings.Trim(rest, "0123456789abcdef") == ""
	}
	return label != "" && strings.Trim(label, "0123456789") == ""
}

// refusedHeaders are names a "header" credential may not use: they frame
// the request, route it, or are the ones the gateway forwards.
var refusedHeaders = map[string]bool{
	"Host": true, "Content-Length": true, "Transfer-Encoding": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Expect": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Proxy-Connection": true, "Cookie": true,
}

// checkScheme checks the scheme and the field it needs (user, header).
func (a *Alias) checkScheme() error {
	switch a.Scheme {
	case SchemeBearer:
	case SchemeBasic:
		if a.User == "" {
			return fmt.Errorf(`"user" missing: scheme basic needs the user name sent with the secret`)
		}
		if strings.ContainsAny(a.User, ":") || !visible(a.User) {
			return fmt.Errorf(`"user": a basic user name is visible ASCII without ':': fix it`)
		}
	case SchemeHeader:
		if a.Header == "" {
			return fmt.Errorf(`"header" missing: scheme header needs the name of the header that carries the secret`)
		}
		canon := http.CanonicalHeaderKey(a.Header)
		if !httpguts.ValidHeaderFieldName(a.Header) || refusedHeaders[canon] || forwarded[canon] {
			return fmt.Errorf(`"header": %q is not a header name a secret may use: name the API's own header, e.g. X-Api-Key`, a.Header)
		}
		a.Header = canon
	default:
		return fmt.Errorf(`"scheme" %q: use "bearer", "basic" or "header"`, a.Scheme)
	}
	if a.Scheme != SchemeBasic && a.User != "" {
		return fmt.Errorf(`"user" is for scheme basic only: remove it`)
	}
	if a.Scheme != SchemeHeader && a.Header != "" {
		return fmt.Errorf(`"header" is for scheme header only: remove it`)
	}
	return nil
}

// envName is the syntax of an environment variable a source names.
var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// checkSource checks a source's syntax: env:NAME or file:/absolute/path.
func checkSource(src string) error {
	if name, ok := strings.CutPrefix(src, "env:"); ok {
		if !envName.MatchString(name) {
			return fmt.Errorf("env: names a variable (letters, digits, '_'): fix the name (the value is not shown, in case it is the secret)")
		}
		return nil
	}
	if p, ok := strings.CutPrefix(src, "file:"); ok {
		if !filepath.IsAbs(p) || filepath.Clean(p) != p {
			return fmt.Errorf("%q: file: takes an absolute, clean path: give the full path", src)
		}
		return nil
	}
	return fmt.Errorf("use env:NAME or file:/absolute/path (the value is not shown, in case it is the secret: keep the secret itself in the variable or the file)")
}

// readCA reads a ca_file: an absolute path to PEM certificates.
func readCA(path string) ([]byte, error) {
	if !filepath.IsAbs(path) {
		return nil, fmt.Errorf("%q is not an absolute path: give the full path", path)
	}
	b, err := readCAFile(path)
	if err != nil {
		return nil, err
	}
	if _, err := certPool(b); err != nil {
		return nil, fmt.Errorf("%s: %v: give a PEM file of CA certificates", path, err)
	}
	return b, nil
}

// MaxCAFile caps a ca_file: a whole system bundle is a few hundred KiB.
const MaxCAFile = 4 << 20

// readCAFile reads a ca_file that is a regular file (a link to one
// included) of at most MaxCAFile bytes: a FIFO, a device or a huge file is
// refused before any read, so that Load neither blocks nor fills memory.
func readCAFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%v: give a readable PEM file of CA certificates", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	switch {
	case err != nil:
		return nil, fmt.Errorf("%v: give a readable PEM file of CA certificates", err)
	case !fi.Mode().IsRegular():
		return nil, fmt.Errorf("%s is not a regular file: give a PEM file of CA certificates", path)
	case fi.Size() > MaxCAFile:
		return nil, fmt.Errorf("%s has %d bytes, over the limit of %d: give a PEM file of CA certificates", path, fi.Size(), MaxCAFile)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxCAFile+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %v", path, err)
	}
	if len(b) > MaxCAFile {
		return nil, fmt.Errorf("%s grew over the limit of %d bytes while it was read", path, MaxCAFile)
	}
	return b, nil
}

// certPool parses PEM certificates into a pool of their own.
func certPool(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("a PEM block of type %q, not CERTIFICATE", blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, err
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("no PEM certificate")
	}
	return pool, nil
}

// visible reports whether s is visible ASCII only.
func visible(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e {
			return false
		}
	}
	return s != ""
}
