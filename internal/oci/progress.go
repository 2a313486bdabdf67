package oci

import (
	"io"
	"sync"
	"time"
)

// Progress is one report of a long transfer (an import, a push, a pull).
// Bytes and Total count what crosses the wire (compressed); Total is 0
// when it is not known in advance.
type Progress struct {
	Op        string `json:"op"`   // import, push or pull
	Item      string `json:"item"` // what moves now, e.g. "layer 2/5 sha256:0123abcd"
	Items     int    `json:"items"`
	ItemsDone int    `json:"items_done"`
	Bytes     int64  `json:"bytes"`
	Total     int64  `json:"total"`
	// Skipped counts items the other side already had.
	Skipped int `json:"skipped"`
	// Final is set on the last report of the transfer.
	Final bool `json:"final"`
}

// meterEvery is how often a Meter reports while bytes flow.
const meterEvery = 100 * time.Millisecond

// Meter keeps the progress of one transfer and reports it to a callback:
// at every item boundary, and at most every 100 ms while bytes flow. A nil
// callback makes every method a no-op. It is safe for concurrent use.
type Meter struct {
	fn func(Progress)

	mu   sync.Mutex // guards following
	p    Progress
	last time.Time
}

// NewMeter starts the progress of op over items items and total bytes (0:
// unknown).
func NewMeter(op string, items int, total int64, fn func(Progress)) *Meter {
	return &Meter{fn: fn, p: Progress{Op: op, Items: items, Total: total}}
}

func (m *Meter) emit(force bool) {
	if m.fn == nil {
		return
	}
	now := time.Now()
	if !force && now.Sub(m.last) < meterEvery {
		return
	}
	m.last = now
	p := m.p
	m.mu.Unlock()
	m.fn(p)
	m.mu.Lock()
}

// Start says item is moving now.
func (m *Meter) Start(item string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Item = item
	m.emit(true)
}

// AddTotal raises the expected byte total (for sizes learnt on the way).
func (m *Meter) AddTotal(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Total += n
}

// Add counts n bytes moved.
func (m *Meter) Add(n int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Bytes += n
	m.emit(false)
}

// Finish marks the current item done; skipped says the other side
// already had it, so nothing moved.
func (m *Meter) Finish(skipped bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.ItemsDone++
	if skipped {
		m.p.Skipped++
	}
	m.emit(true)
}

// Done sends the final report.
func (m *Meter) Done() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.p.Final, m.p.Item = true, ""
	m.emit(true)
}

// Snapshot returns the progress so far.
func (m *Meter) Snapshot() Progress {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.p
}

// Reader counts what is read through r into m.
func (m *Meter) Reader(r io.Reader) io.Reader { return &meterReader{r: r, m: m} }

type meterReader struct {
	r io.Reader
	m *Meter
}

func (c *meterReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.m.Add(int64(n))
	}
	return n, err
}
