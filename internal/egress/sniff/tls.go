package sniff

import (
	"encoding/binary"
	"errors"
)

// Errors of the first-bytes parsers.
var (
	// errNeedMore means the bytes so far are a valid prefix; read more.
	errNeedMore = errors.New("incomplete")
	errNotTLS   = errors.New("not a TLS ClientHello")
	errNoSNI    = errors.New("TLS ClientHello without server_name")
)

// NeedMore reports whether a parser error means "read more bytes".
func NeedMore(err error) bool { return errors.Is(err, errNeedMore) }

// maxClientHello bounds the handshake message a parser will wait for.
const maxClientHello = 16 << 10

// ParseClientHelloSNI returns the server_name of the TLS ClientHello that
// starts b. The hello may span several TLS records. errNeedMore (see
// [NeedMore]) means b is an incomplete but so far valid hello.
func ParseClientHelloSNI(b []byte) (string, error) {
	// Reassemble the handshake message from consecutive handshake records.
	var hs []byte
	rest := b
	for {
		if len(rest) < 5 {
			if len(rest) > 0 && rest[0] != 0x16 {
				return "", errNotTLS
			}
			return "", errNeedMore
		}
		if rest[0] != 0x16 || rest[1] != 0x03 {
			return "", errNotTLS
		}
		n := int(binary.BigEndian.Uint16(rest[3:5]))
		if n == 0 || n > 1<<14+2048 {
			return "", errNotTLS
		}
		if len(rest) < 5+n {
			hs = append(hs, rest[5:]...)
			if len(hs) >= 4 && hs[0] != 0x01 {
				return "", errNotTLS
			}
			return "", errNeedMore
		}
		hs = append(hs, rest[5:5+n]...)
		rest = rest[5+n:]
		if len(hs) < 4 {
			continue
		}
		if hs[0] != 0x01 { // client_hello
			return "", errNotTLS
		}
		size := int(hs[1])<<16 | int(hs[2])<<8 | int(hs[3])
		if size > maxClientHello {
			return "", errNotTLS
		}
		if len(hs) >= 4+size {
			return helloSNI(hs[4 : 4+size])
		}
	}
}

// helloSNI walks a ClientHello body to its server_name extension.
func helloSNI(h []byte) (string, error) {
	r := reader(h)
	if !r.skip(2+32) || !r.skipVec8() || !r.skipVec16() || !r.skipVec8() {
		return "", errNotTLS
	}
	if len(r) == 0 {
		return "", errNoSNI // no extensions at all
	}
	exts, ok := r.vec16()
	if !ok {
		return "", errNotTLS
	}
	for len(exts) > 0 {
		var typ uint16
		var body reader
		if typ, ok = exts.u16(); !ok {
			return "", errNotTLS
		}
		if body, ok = exts.vec16(); !ok {
			return "", errNotTLS
		}
		if typ != 0 { // server_name
			continue
		}
		list, ok := body.vec16()
		if !ok {
			return "", errNotTLS
		}
		for len(list) > 0 {
			kind, ok := list.u8()
			if !ok {
				return "", errNotTLS
			}
			name, ok := list.vec16()
			if !ok {
				return "", errNotTLS
			}
			if kind == 0 { // host_name
				return string(name), nil
			}
		}
		return "", errNoSNI
	}
	return "", errNoSNI
}

// reader is a cursor over TLS wire bytes.
type reader []byte

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) u8() (byte, bool) {
	if len(*r) < 1 {
		return 0, false
	}
	v := (*r)[0]
	*r = (*r)[1:]
	return v, true
}

func (r *reader) u16() (uint16, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return v, true
}

func (r *reader) skipVec8() bool {
	n, ok := r.u8()
	return ok && r.skip(int(n))
}

func (r *reader) skipVec16() bool {
	_, ok := r.vec16()
	return ok
}

func (r *reader) vec16() (reader, bool) {
	n, ok := r.u16()
	if !ok || len(*r) < int(n) {
		return nil, false
	}
	v := (*r)[:n]
	*r = (*r)[n:]
	return v, true
}
