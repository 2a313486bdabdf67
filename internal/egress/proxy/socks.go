package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// SOCKS5 wire values (RFC 1928).
const (
	socksVersion    = 5
	socksNoAuth     = 0
	socksNoMethod   = 0xff
	socksConnect    = 1
	socksAtypV4     = 1
	socksAtypDomain = 3
	socksAtypV6     = 4

	socksOK             = 0
	socksFailure        = 1
	socksNotAllowed     = 2
	socksHostUnreach    = 4
	socksCmdUnsupported = 7
	socksAtypUnsupp     = 8
)

// SOCKSRequest is a parsed SOCKS5 CONNECT request.
type SOCKSRequest struct {
	Cmd  byte
	Host string // a name as sent, or an address's text
	Port uint16
}

// ReadSOCKSRequest reads a SOCKS5 greeting and request from r and writes
// the method choice to w. A request other than CONNECT is returned with its
// Cmd for the caller to refuse.
func ReadSOCKSRequest(r io.Reader, w io.Writer) (SOCKSRequest, error) {
	var hdr [2]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return SOCKSRequest{}, err
	}
	if hdr[0] != socksVersion {
		return SOCKSRequest{}, fmt.Errorf("socks: version %d, want 5", hdr[0])
	}
	methods := make([]byte, hdr[1])
	if _, err := io.ReadFull(r, methods); err != nil {
		return SOCKSRequest{}, err
	}
	hasNoAuth := false
	for _, m := range methods {
		hasNoAuth = hasNoAuth || m == socksNoAuth
	}
	if !hasNoAuth {
		w.Write([]byte{socksVersion, socksNoMethod})
		return SOCKSRequest{}, fmt.Errorf("socks: client offers no unauthenticated method")
	}
	if _, err := w.Write([]byte{socksVersion, socksNoAuth}); err != nil {
		return SOCKSRequest{}, err
	}
	var req [4]byte
	if _, err := io.ReadFull(r, req[:]); err != nil {
		return SOCKSRequest{}, err
	}
	if req[0] != socksVersion {
		return SOCKSRequest{}, fmt.Errorf("socks: request version %d, want 5", req[0])
	}
	out := SOCKSRequest{Cmd: req[1]}
	switch req[3] {
	case socksAtypV4:
		var a [4]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return out, err
		}
		out.Host = netip.AddrFrom4(a).String()
	case socksAtypV6:
		var a [16]byte
		if _, err := io.ReadFull(r, a[:]); err != nil {
			return out, err
		}
		out.Host = netip.AddrFrom16(a).String()
	case socksAtypDomain:
		var n [1]byte
		if _, err := io.ReadFull(r, n[:]); err != nil {
			return out, err
		}
		name := make([]byte, n[0])
		if _, err := io.ReadFull(r, name); err != nil {
			return out, err
		}
		out.Host = string(name)
	default:
		return out, errSOCKSAtyp
	}
	var port [2]byte
	if _, err := io.ReadFull(r, port[:]); err != nil {
		return out, err
	}
	out.Port = uint16(port[0])<<8 | uint16(port[1])
	return out, nil
}

var errSOCKSAtyp = errors.New("socks: unknown address type")

func socksReply(w io.Writer, code byte) error {
	_, err := w.Write([]byte{socksVersion, code, 0, socksAtypV4, 0, 0, 0, 0, 0, 0})
	return err
}

func (p *Server) handleSOCKS(c net.Conn) {
	br := bufio.NewReader(c)
	c.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := ReadSOCKSRequest(br, c)
	c.SetReadDeadline(time.Time{})
	if err != nil {
		if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) {
			p.record(flightrec.Event{Time: time.Now(), Proto: egress.ProtoSOCKS, Host: egress.MalformedHost,
				Reason: egress.ReasonBadRequest, Error: err.Error()})
		}
		if errors.Is(err, errSOCKSAtyp) {
			socksReply(c, socksAtypUnsupp)
		}
		return
	}
	ev := flightrec.Event{Time: time.Now(), Proto: egress.ProtoSOCKS, Host: egress.RecordHost(req.Host), Port: req.Port}
	switch {
	case req.Cmd != socksConnect:
		ev.Reason = egress.ReasonBadRequest
		if req.Cmd == 3 { // UDP ASSOCIATE
			ev.Reason = egress.ReasonNonTCP
		}
		p.record(ev)
		socksReply(c, socksCmdUnsupported)
		return
	case req.Port == 0:
		ev.Reason = egress.ReasonBadRequest
		p.record(ev)
		socksReply(c, socksFailure)
		return
	}
	p.tunnel(c, br, egress.ProtoSOCKS, req.Host, req.Port, func(a answer, _ flightrec.Event) error {
		return socksReply(c, [...]byte{answerOK: socksOK, answerRefused: socksNotAllowed, answerFailed: socksHostUnreach}[a])
	})
}
