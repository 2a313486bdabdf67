package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// ErrFrameTooLarge is returned for a frame over [MaxFrame] or a header over
// [MaxHeader], on either read or write.
var ErrFrameTooLarge = errors.New("agentproto: frame too large")

// ErrBadHeader is returned for a frame whose header is not a message.
var ErrBadHeader = errors.New("agentproto: decoding header")

// WriteFrame encodes m and payload as one frame and writes it with a single
// Write call, so that concurrent writers serialised by a mutex never
// interleave partial frames.
func WriteFrame(w io.Writer, m *Msg, payload []byte) error {
	hdr, err := json.Marshal(m)
	if err != nil {
		return fmt.Errorf("agentproto: encoding %s: %w", m.Kind, err)
	}
	if len(hdr) > MaxHeader {
		return ErrFrameTooLarge
	}
	total := 4 + len(hdr) + len(payload)
	if 4+total > MaxFrame {
		return ErrFrameTooLarge
	}
	buf := make([]byte, 8, 4+total)
	binary.LittleEndian.PutUint32(buf[0:4], uint32(total))
	binary.LittleEndian.PutUint32(buf[4:8], uint32(len(hdr)))
	buf = append(buf, hdr...)
	buf = append(buf, payload...)
	_, err = w.Write(buf)
	return err
}

// ReadFrame reads one frame. It returns io.EOF only on a clean end at a frame
// boundary, and io.ErrUnexpectedEOF for a stream cut inside a frame.
func ReadFrame(r io.Reader) (*Msg, []byte, error) {
	var lens [8]byte
	if _, err := io.ReadFull(r, lens[:4]); err != nil {
		return nil, nil, err
	}
	total := binary.LittleEndian.Uint32(lens[:4])
	if total < 4 || 4+uint64(total) > MaxFrame {
		return nil, nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, total)
	}
	if _, err := io.ReadFull(r, lens[4:8]); err != nil {
		return nil, nil, noEOF(err)
	}
	hlen := binary.LittleEndian.Uint32(lens[4:8])
	if hlen > MaxHeader || hlen > total-4 {
		return nil, nil, fmt.Errorf("%w: header %d bytes", ErrFrameTooLarge, hlen)
	}
	body := make([]byte, total-4)
	if _, err := io.ReadFull(r, body); err != nil {
		return nil, nil, noEOF(err)
	}
	m := new(Msg)
	if err := json.Unmarshal(body[:hlen], m); err != nil {
		return nil, nil, fmt.Errorf("%w: %w", ErrBadHeader, err)
	}
	payload := body[hlen:]
	if len(payload) == 0 {
		payload = nil
	}
	return m, payload, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// ValidEnv reports whether kv is an acceptable KEY=VALUE entry: a non-empty
// name without '=' or NUL, and a value without NUL.
func ValidEnv(kv string) error {
	i := -1
	for j := 0; j < len(kv); j++ {
		if kv[j] == '=' {
			i = j
			break
		}
	}
	switch {
	case i < 0:
		return fmt.Errorf("env %q: want KEY=VALUE", kv)
	case i == 0:
		return fmt.Errorf("env %q: empty name", kv)
	}
	for j := 0; j < len(kv); j++ {
		if kv[j] == 0 {
			return fmt.Errorf("env %q: contains NUL", kv[:i])
		}
	}
	return nil
}
