package flightrec

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"sync"
	"time"

	"isopod/internal/egress"
	"isopod/internal/errdefs"
)

// Modes of a run's network, as files and reports name them (egress.Mode's
// names).
const (
	ModeNAT      = string(egress.ModeNAT)
	ModeFiltered = string(egress.ModeFiltered)
)

// DefaultMaxEvents caps the lines a Log writes.
const DefaultMaxEvents = 100_000

// Config configures a [Log].
type Config struct {
	// Path is the JSON Lines file (mode 0600): vms/<id>/net.jsonl, appended
	// to, for ModeNAT; vms/<id>/egress.jsonl, created afresh, for
	// ModeFiltered.
	Path string
	// Mode is ModeNAT or ModeFiltered; "" means ModeNAT.
	Mode string
	// Start is the run's start; event timestamps are relative to it. Zero
	// means when the Log is opened.
	Start time.Time
	// Rules are the run's parsed policy (ModeFiltered); the report's
	// allowed_rules are theirs.
	Rules egress.Rules
	// MaxEvents caps the lines written; later events are only counted.
	// 0 means DefaultMaxEvents.
	MaxEvents int
	Logger    *slog.Logger
	// Continue appends to the file in either mode: the VM resumes after a
	// pause and its log goes on.
	Continue bool
}

// Validate checks c.
func (c *Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("flight recorder: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
	}
	switch {
	case c.Path == "":
		return bad("empty path (give the run's net.jsonl or egress.jsonl)")
	case c.MaxEvents < 0:
		return bad("max events %d is negative (0 means the default)", c.MaxEvents)
	case c.Mode != "" && c.Mode != ModeNAT && c.Mode != ModeFiltered:
		return bad("mode %q (want %s or %s)", c.Mode, ModeNAT, ModeFiltered)
	}
	return nil
}

// Defaults returns c with its zero fields given their defaults: Start
// now, MaxEvents DefaultMaxEvents, Mode ModeNAT.
func (c Config) Defaults() Config {
	if c.Start.IsZero() {
		c.Start = time.Now()
	}
	if c.MaxEvents == 0 {
		c.MaxEvents = DefaultMaxEvents
	}
	if c.Mode == "" {
		c.Mode = ModeNAT
	}
	return c
}

// Shape returns ev as a recorder configured by c keeps it, which is what a
// reader of its file gets back: TS counted from c.Start to ev.Time (now,
// when zero), and Time cleared; in ModeFiltered sanitised (the host as
// egress.RecordHost shows it, see sanitise) and without DurationMS, which
// egress.jsonl does not carry; in ModeNAT its variable-size fields
// trimmed.
func (c Config) Shape(ev Event) Event {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	ev.TS = ev.Time.Sub(c.Start).Milliseconds()
	ev.Time = time.Time{}
	if c.Mode == ModeFiltered {
		ev = sanitise(ev)
		ev.DurationMS = 0
	} else {
		trim(&ev)
	}
	return ev
}

// Log is a Recorder that appends one JSON object per event to a file and
// keeps [Totals] and, in ModeFiltered, the report's egress block. It holds
// no more events in memory than the report shows, and each event is
// flushed as it is recorded, so the file is complete up to the last flow
// even if isopod dies. Safe for concurrent use.
type Log struct {
	cfg Config

	mu     sync.Mutex // guards following
	out    *jsonlWriter
	totals Totals
	rep    *reportBuilder // ModeFiltered only
}

var _ Recorder = (*Log)(nil)

// Open opens cfg.Path.
func Open(cfg Config) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.Defaults()
	flag := os.O_APPEND
	if cfg.Mode == ModeFiltered && !cfg.Continue {
		flag = os.O_TRUNC
	}
	out, err := openJSONL(cfg.Path, flag, cfg.MaxEvents, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("opening flight recorder: %w", err)
	}
	l := &Log{cfg: cfg, out: out}
	if cfg.Mode == ModeFiltered {
		l.rep = newReportBuilder(cfg.Rules.Strings(), cfg.Path)
	}
	return l, nil
}

// Record implements Recorder. Write errors are logged once; the totals stay
// right regardless.
func (l *Log) Record(ev Event) {
	ev = l.cfg.Shape(ev)
	var line any
	if l.rep != nil {
		line = ev.ledgerLine()
	} else {
		line = ev.natLine()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.totals.Add(ev)
	if l.rep != nil {
		l.rep.add(ev)
	}
	if !l.out.write(line) {
		l.totals.Dropped++
	}
}

// trim caps ev's variable-size fields (net.jsonl).
func trim(ev *Event) {
	if len(ev.Host) > egress.MaxHostLen {
		ev.Host = ev.Host[:egress.MaxHostLen]
	}
	if len(ev.Error) > MaxErrLen {
		ev.Error = ev.Error[:MaxErrLen]
	}
	if len(ev.Answers) > MaxAnswers {
		ev.Answers = ev.Answers[:MaxAnswers]
	}
	if len(ev.Path) > MaxPathLen {
		ev.Path = ev.Path[:MaxPathLen]
	}
}

// sanitise turns ev into its egress.jsonl form: the host as
// egress.RecordHost shows it (the address when there is no name; for a DNS
// message, which has no address of its own, egress.MalformedHost), no
// address or port for DNS, the path's own "never forwarded" as the non-TCP
// rule, capped fields.
func sanitise(ev Event) Event {
	ev.Host = egress.RecordHost(ev.Host)
	if ev.Proto == egress.ProtoDNS {
		ev.Port, ev.Dst = 0, netip.Addr{}
		if ev.Host == "" {
			ev.Host = egress.MalformedHost
		}
	}
	if ev.Host == "" && ev.Dst.IsValid() {
		ev.Dst = ev.Dst.Unmap()
		ev.Host = ev.Dst.String()
	}
	if !ev.Allowed && ev.Reason == egress.ReasonNotForwarded {
		ev.Reason = egress.ReasonNonTCP
	}
	if len(ev.Answers) > MaxAnswers {
		ev.Answers = ev.Answers[:MaxAnswers]
	}
	if len(ev.Error) > MaxErrLen {
		ev.Error = ev.Error[:MaxErrLen]
	}
	if len(ev.Path) > MaxPathLen {
		ev.Path = ev.Path[:MaxPathLen]
	}
	ev.Answers = append([]string(nil), ev.Answers...)
	return ev
}

// Totals returns the counts so far.
func (l *Log) Totals() Totals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totals
}

// Report returns the egress block so far; nil in ModeNAT.
func (l *Log) Report() *Report {
	if l.rep == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rep.report(l.totals.Dropped > 0)
	return &r
}

// Path is the file written.
func (l *Log) Path() string { return l.cfg.Path }

// Close flushes and closes the file; later events are only counted.
// Idempotent.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.close()
}

// ReadEvents reads a file a Log wrote, in either format.
func ReadEvents(r io.Reader) ([]Event, error) {
	var out []Event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("flight record line %d: %v: %w", n, err, errdefs.ErrInvalidArgument)
		}
		out = append(out, ev)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading flight record: %w", err)
	}
	return out, nil
}
