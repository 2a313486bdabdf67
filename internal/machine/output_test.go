package machine

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestCaptureHeadTotalAndCap(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.log")
	c, err := NewCapture(path, 100<<10)
	if err != nil {
		t.Fatal(err)
	}
	chunk := bytes.Repeat([]byte("abcdefgh"), 4096) // 32 KiB
	for range 5 {
		c.Write(chunk)
	}
	c.Close()
	text, trunc, total := c.Inline()
	if total != 5*32<<10 || !trunc || len(text) != InlineCap {
		t.Errorf("total %d trunc %v inline %d", total, trunc, len(text))
	}
	b, _ := os.ReadFile(path)
	if !strings.HasPrefix(string(b), string(chunk)) || !strings.HasSuffix(string(b), logCapMarker) || len(b) != 100<<10+len(logCapMarker) {
		t.Errorf("log: %d bytes", len(b))
	}
}

func TestCaptureCutRune(t *testing.T) {
	c, err := NewCapture(filepath.Join(t.TempDir(), "o"), LogCap)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// A 3-byte rune straddling the inline cap.
	c.Write(bytes.Repeat([]byte("x"), InlineCap-1))
	c.Write([]byte("€tail"))
	text, trunc, _ := c.Inline()
	if !trunc || !utf8.ValidString(text) || strings.ContainsRune(text, '\uFFFD') {
		t.Errorf("inline head not cut on a rune boundary: trunc=%v tail=%q", trunc, text[len(text)-4:])
	}
}

type closeBuffer struct{ bytes.Buffer }

func (*closeBuffer) Close() error { return nil }

func TestCappedWriterNeverFails(t *testing.T) {
	var b closeBuffer
	w := &CappedWriter{w: &b, cap: 10}
	for range 3 {
		if n, err := w.Write([]byte("0123456")); n != 7 || err != nil {
			t.Fatalf("Write = %d, %v", n, err)
		}
	}
	if got := b.String(); got != "0123456012"+logCapMarker {
		t.Errorf("kept %q", got)
	}
}

// TestOutputCapsAsDocumented pins the caps SECURITY.md states.
func TestOutputCapsAsDocumented(t *testing.T) {
	if InlineCap != 64<<10 || LogCap != 64<<20 || SerialLogCap != 16<<20 {
		t.Errorf("caps: inline %d, log %d, console %d; documented 64 KiB, 64 MiB, 16 MiB", InlineCap, LogCap, SerialLogCap)
	}
}
