package agentproto

import (
	"bytes"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	code := 42
	tests := []struct {
		name    string
		msg     Msg
		payload []byte
	}{
		{"hello", Msg{ID: 0, Kind: KindHello, Hello: &Hello{Version: Version}}, nil},
		{"output", Msg{ID: 7, Kind: KindOutput, Stream: "stdout"}, []byte("hi\x00\xff")},
		{"done", Msg{ID: 9, Kind: KindExecDone, Done: &ExecDone{ExitCode: &code}}, nil},
		{"chunk", Msg{ID: 3, Kind: KindFileChunk}, bytes.Repeat([]byte{1}, ChunkSize)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var buf bytes.Buffer
			if err := WriteFrame(&buf, &tt.msg, tt.payload); err != nil {
				t.Fatal(err)
			}
			m, p, err := ReadFrame(&buf)
			if err != nil {
				t.Fatal(err)
			}
			if m.ID != tt.msg.ID || m.Kind != tt.msg.Kind || m.Stream != tt.msg.Stream {
				t.Errorf("got %+v; want %+v", m, tt.msg)
			}
			if !bytes.Equal(p, tt.payload) {
				t.Errorf("payload: got %d bytes; want %d", len(p), len(tt.payload))
			}
			if _, _, err := ReadFrame(&buf); err != io.EOF {
				t.Errorf("after last frame: got %v; want io.EOF", err)
			}
		})
	}
}

func TestFrameLimits(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteFrame(&buf, &Msg{Kind: KindStdin}, make([]byte, MaxFrame)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversize write: got %v; want ErrFrameTooLarge", err)
	}
	// A length field claiming more than MaxFrame is refused before reading.
	bad := []byte{0xff, 0xff, 0xff, 0x7f}
	if _, _, err := ReadFrame(bytes.NewReader(bad)); !errors.Is(err, ErrFrameTooLarge) {
		t.Errorf("oversize read: got %v; want ErrFrameTooLarge", err)
	}
	// A stream cut inside a frame is not a clean EOF.
	WriteFrame(&buf, &Msg{Kind: KindPing, ID: 1}, []byte("abc"))
	cut := buf.Bytes()[:buf.Len()-1]
	if _, _, err := ReadFrame(bytes.NewReader(cut)); err != io.ErrUnexpectedEOF {
		t.Errorf("cut frame: got %v; want io.ErrUnexpectedEOF", err)
	}
}

func TestValidEnv(t *testing.T) {
	for _, tt := range []struct {
		kv string
		ok bool
	}{
		{"A=1", true}, {"A=", true}, {"A=b=c", true},
		{"=x", false}, {"A", false}, {"A=x\x00", false}, {"", false},
	} {
		if err := ValidEnv(tt.kv); (err == nil) != tt.ok {
			t.Errorf("ValidEnv(%q) = %v; want ok=%v", tt.kv, err, tt.ok)
		}
	}
}
