package egress

import (
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"
)

// Event is one flow's record: a line of vms/<id>/net.jsonl.
type Event struct {
	// TS is when the flow began, in milliseconds since the recorder's start
	// (the run's start). A [Log] fills it from Time.
	TS int64 `json:"ts_ms"`
	// Time is when the flow began; the zero value means "when recorded".
	Time time.Time `json:"-"`

	Proto   string     `json:"proto"` // ProtoTCP, ProtoUDP, ProtoDNS, ProtoICMP
	Dst     netip.Addr `json:"dst"`
	Port    uint16     `json:"port,omitempty"`
	Host    string     `json:"host,omitempty"`
	Allowed bool       `json:"allowed"`
	Reason  string     `json:"reason,omitempty"`
	Error   string     `json:"error,omitempty"` // how an allowed flow failed

	// DNS only.
	QType   string   `json:"qtype,omitempty"`
	Rcode   string   `json:"rcode,omitempty"`
	Answers []string `json:"answers,omitempty"`

	BytesUp    int64 `json:"bytes_up"`   // guest to destination
	BytesDown  int64 `json:"bytes_down"` // destination to guest
	DurationMS int64 `json:"duration_ms"`
}

// Caps on one event's variable-size fields; a Log trims longer ones.
const (
	MaxHostLen = 253
	MaxErrLen  = 200
	MaxAnswers = 16
)

// Recorder receives flow records. Record must be safe for concurrent use and
// must not block for long: it is called from the network path.
type Recorder interface {
	Record(ev Event)
}

// Totals summarises recorded flows for a run's report.
type Totals struct {
	Flows     int   `json:"flows"`  // every recorded event, refused ones included
	Denied    int   `json:"denied"` // events with Allowed false
	BytesUp   int64 `json:"bytes_up"`
	BytesDown int64 `json:"bytes_down"`
	// Dropped counts events counted in the totals but not written, once a
	// Log's MaxEvents was reached.
	Dropped int `json:"dropped,omitempty"`
}

// Add counts ev.
func (t *Totals) Add(ev Event) {
	t.Flows++
	if !ev.Allowed {
		t.Denied++
	}
	t.BytesUp += ev.BytesUp
	t.BytesDown += ev.BytesDown
}

// DefaultMaxEvents caps the lines a Log writes.
const DefaultMaxEvents = 100_000

// LogConfig configures a [Log].
type LogConfig struct {
	// Path is the JSON Lines file, created or appended to (mode 0600).
	Path string
	// Start is the run's start; event timestamps are relative to it. Zero
	// means when the Log is opened.
	Start time.Time
	// MaxEvents caps the lines written; later events are only counted.
	// 0 means DefaultMaxEvents.
	MaxEvents int
	Logger    *slog.Logger
}

// Validate checks c.
func (c *LogConfig) Validate() error {
	return validateJSONL("egress log", "net.jsonl", c.Path, c.MaxEvents)
}

// Log is a Recorder that appends one JSON object per event to a file and
// keeps [Totals]. It holds no events in memory and is safe for concurrent
// use. Each event is flushed as it is recorded, so the file is complete up
// to the last flow even if isopod dies.
type Log struct {
	start time.Time

	mu     sync.Mutex
	out    *jsonlWriter
	totals Totals
}

// OpenLog opens cfg.Path for appending.
func OpenLog(cfg LogConfig) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Start, cfg.MaxEvents = jsonlDefaults(cfg.Start, cfg.MaxEvents)
	out, err := openJSONL("egress log", cfg.Path, os.O_APPEND, cfg.MaxEvents, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("opening egress log: %w", err)
	}
	return &Log{start: cfg.Start, out: out}, nil
}

// Record implements Recorder. Write errors are logged once; the totals stay
// right regardless.
func (l *Log) Record(ev Event) {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	ev.TS = ev.Time.Sub(l.start).Milliseconds()
	trim(&ev)

	l.mu.Lock()
	defer l.mu.Unlock()
	l.totals.Add(ev)
	if !l.out.write(&ev) {
		l.totals.Dropped++
	}
}

// Totals returns the counts so far.
func (l *Log) Totals() Totals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totals
}

// Path is the file written.
func (l *Log) Path() string { return l.out.name() }

// Close flushes and closes the file. Later events are only counted.
// Idempotent.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.close()
}

func trim(ev *Event) {
	if len(ev.Host) > MaxHostLen {
		ev.Host = ev.Host[:MaxHostLen]
	}
	if len(ev.Error) > MaxErrLen {
		ev.Error = ev.Error[:MaxErrLen]
	}
	if len(ev.Answers) > MaxAnswers {
		ev.Answers = ev.Answers[:MaxAnswers]
	}
}
