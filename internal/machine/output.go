package machine

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// Output caps.
const (
	// InlineCap is how much of each output stream a report carries.
	InlineCap = 64 << 10
	// LogCap is how much of each output stream is kept on disk.
	LogCap = 64 << 20
	// SerialLogCap is how much of the guest console is kept on disk.
	SerialLogCap = 16 << 20
)

// Capture keeps one output stream: the complete stream on disk up to a cap,
// the first InlineCap bytes in memory, and the exact byte total.
type Capture struct {
	mu     sync.Mutex // guards following
	f      *os.File
	head   []byte
	total  int64
	logCap int64
	capped bool
}

const logCapMarker = "\n[isopod: log cap reached; the rest of this stream was counted but not kept]\n"

// NewCapture creates the log at path, keeping at most logCap bytes of the
// stream in it.
func NewCapture(path string, logCap int64) (*Capture, error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating output log: %w", err)
	}
	return &Capture{f: f, logCap: logCap}, nil
}

// Write never fails on account of the cap; it fails only on a disk error.
func (c *Capture) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if room := InlineCap - len(c.head); room > 0 {
		c.head = append(c.head, p[:min(room, len(p))]...)
	}
	var err error
	if !c.capped {
		keep := p
		if rest := c.logCap - c.total; int64(len(keep)) > rest {
			keep = keep[:max(rest, 0)]
			c.capped = true
		}
		if _, werr := c.f.Write(keep); werr != nil {
			err = fmt.Errorf("writing output log: %w", werr)
		}
		if c.capped {
			c.f.WriteString(logCapMarker)
		}
	}
	c.total += int64(len(p))
	return len(p), err
}

// Close flushes the log.
func (c *Capture) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.f.Close()
}

// Inline returns the head as text (invalid UTF-8 replaced), whether the
// stream was longer than the head, and the exact total.
func (c *Capture) Inline() (text string, truncated bool, total int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return strings.ToValidUTF8(trimPartialRune(c.head, c.total > int64(len(c.head))), "\uFFFD"), c.total > int64(len(c.head)), c.total
}

// trimPartialRune drops a rune cut in half by the inline cap.
func trimPartialRune(b []byte, cut bool) string {
	if !cut {
		return string(b)
	}
	for i := 0; i < utf8.UTFMax && i < len(b); i++ {
		r, size := utf8.DecodeLastRune(b[:len(b)-i])
		if r != utf8.RuneError || size > 1 {
			return string(b[:len(b)-i])
		}
	}
	return string(b)
}

// CappedWriter keeps the first n bytes written to it in a file (the guest
// console) and discards the rest after a marker, without ever failing.
type CappedWriter struct {
	mu  sync.Mutex // guards following
	w   io.WriteCloser
	n   int64
	cap int64
}

// NewCappedWriter keeps the first n bytes written in w.
func NewCappedWriter(w io.WriteCloser, n int64) *CappedWriter {
	return &CappedWriter{w: w, cap: n}
}

func (c *CappedWriter) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n < c.cap {
		keep := p[:min(int64(len(p)), c.cap-c.n)]
		c.w.Write(keep)
		c.n += int64(len(keep))
		if c.n >= c.cap {
			io.WriteString(c.w, logCapMarker)
		}
	}
	return len(p), nil
}

func (c *CappedWriter) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.w.Close()
}
