package sniff

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"isopod/internal/egress"
)

// HTTP/2 limits. The client may use what the server allows it; these are
// at or above what servers commonly advertise.
const (
	h2MaxFrame      = 1<<24 - 1 // the protocol's largest frame
	h2MaxHeaderList = 1 << 20
	h2MaxTable      = 64 << 10
)

// h2Reader decodes the client's frames with http2.Framer and hpack,
// keeping the bytes each frame came in as, to pass them on unchanged.
type h2Reader struct {
	fr  *http2.Framer
	raw recorder
}

// recorder reads through the Guard and keeps what it read.
type recorder struct {
	g   *Guard
	rec []byte
	err error // the source's last error
}

func (r *recorder) Read(p []byte) (int, error) {
	n, err := r.g.readRaw(p)
	r.rec = append(r.rec, p[:n]...)
	if err != nil {
		r.err = err
	}
	return n, err
}

func (g *Guard) newH2() {
	h := &h2Reader{raw: recorder{g: g}}
	h.fr = http2.NewFramer(io.Discard, &h.raw)
	h.fr.SetMaxReadFrameSize(h2MaxFrame)
	h.fr.MaxHeaderListSize = h2MaxHeaderList
	dec := hpack.NewDecoder(4096, nil)
	dec.SetAllowedMaxDynamicTableSize(h2MaxTable)
	h.fr.ReadMetaHeaders = dec
	g.h2 = h
}

// preface passes the client connection preface on and starts reading
// frames.
func (g *Guard) preface() error {
	if len(g.buf) < len(h2Preface) {
		if err := g.more(maxHead); err != nil {
			return g.early(egress.HostFromHTTP, false, err)
		}
		return nil
	}
	if string(g.buf[:len(h2Preface)]) != h2Preface {
		return g.malformed(false, fmt.Errorf("%w: not the HTTP/2 connection preface", ErrMalformed))
	}
	g.pass(len(h2Preface))
	g.newH2()
	g.state = stFrames
	return nil
}

// frame reads one frame (a HEADERS frame with its CONTINUATIONs), checks
// the names of a header block, and passes the frame on.
func (g *Guard) frame() error {
	h := g.h2
	h.raw.err = nil
	f, err := h.fr.ReadFrame()
	raw := h.raw.rec
	h.raw.rec = nil
	if err != nil {
		if h.raw.err != nil {
			return g.early(egress.HostFromHTTP, false, h.raw.err)
		}
		return g.malformed(false, fmt.Errorf("%w: HTTP/2: %v", ErrMalformed, err))
	}
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		if err := g.checkHeaders(f); err != nil {
			return err
		}
	case *http2.PushPromiseFrame:
		return g.malformed(false, fmt.Errorf("%w: HTTP/2 PUSH_PROMISE from a client", ErrMalformed))
	}
	g.out = append(g.out, raw...)
	if g.first == nil && len(g.out) > maxHead {
		return g.malformed(false, errors.New("no HTTP/2 request in the first frames"))
	}
	return nil
}

// checkHeaders judges a header block's :authority and host. A block with
// neither and no pseudo-header is a trailer block and names nothing.
func (g *Guard) checkHeaders(f *http2.MetaHeadersFrame) error {
	if f.Truncated {
		return g.malformed(false, fmt.Errorf("%w: HTTP/2 header list over %d bytes", ErrMalformed, h2MaxHeaderList))
	}
	var names []string
	pseudo, authorities := false, 0
	for _, hf := range f.Fields {
		switch {
		case hf.Name == ":authority":
			authorities++
			names = append(names, HostOnly(hf.Value))
		case strings.HasPrefix(hf.Name, ":"):
			pseudo = true
		case hf.Name == "host":
			names = append(names, HostOnly(hf.Value))
		}
	}
	switch {
	case authorities > 1:
		return g.malformed(false, fmt.Errorf("%w: HTTP/2 request with %d :authority", ErrMalformed, authorities))
	case !pseudo && len(names) == 0:
		return nil
	}
	v, ok := g.judgeNames(names, egress.HostFromHTTP)
	if !ok {
		return refuse(v, false, nil)
	}
	g.approve(v)
	return nil
}
