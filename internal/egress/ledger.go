package egress

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"isopod/internal/errdefs"
)

// InlineCap is how many entries each list of a [LedgerReport] carries; the
// file has them all.
const InlineCap = 64

// Modes of a run's network, as reports name them.
const (
	ModeNAT      = "nat"
	ModeFiltered = "filtered"
)

// Entry is one line of the egress record (vms/<id>/egress.jsonl) and one
// element of a report's allowed, denied or dns_queries list. Host is a
// normalised name, an address, or "<invalid:N>"; never raw guest bytes.
type Entry struct {
	TS        int64  `json:"ts_ms"`
	Proto     string `json:"proto"` // tcp, udp, icmp, dns, http_proxy, socks5
	Host      string `json:"host"`
	Addr      string `json:"addr,omitempty"` // the destination address, when one was involved
	Port      uint16 `json:"port"`
	Allowed   bool   `json:"allowed"`
	Reason    string `json:"reason"`
	BytesUp   int64  `json:"bytes_up"`
	BytesDown int64  `json:"bytes_down"`
	// DNS only.
	QType   string   `json:"qtype,omitempty"`
	Rcode   string   `json:"rcode,omitempty"`
	Answers []string `json:"answers,omitempty"`
	Error   string   `json:"error,omitempty"`
}

// LedgerReport is the report's egress block.
type LedgerReport struct {
	Mode          string   `json:"mode"`
	AllowedRules  []string `json:"allowed_rules"`
	Allowed       []Entry  `json:"allowed"`
	Denied        []Entry  `json:"denied"`
	DNSQueries    []Entry  `json:"dns_queries"`
	TotalEvents   int      `json:"total_events"`
	Truncated     bool     `json:"truncated"`
	EgressLogPath string   `json:"egress_log_path"`
}

// LedgerConfig configures a [Ledger].
type LedgerConfig struct {
	Path      string    // the JSON Lines file, created (mode 0600)
	Start     time.Time // the run's start; zero: now
	Mode      string    // ModeFiltered or ModeNAT
	Rules     []string  // the report's allowed_rules
	MaxEvents int       // lines written at most; 0: DefaultMaxEvents
	Logger    *slog.Logger
}

// Validate checks c.
func (c *LedgerConfig) Validate() error {
	return validateJSONL("egress ledger", "egress.jsonl", c.Path, c.MaxEvents)
}

// Ledger is the flight recorder of a filtered run: a [Recorder] that turns
// every event into an [Entry] with a sanitised host, appends it to the
// JSON Lines file, and keeps the first InlineCap entries of each list for
// the report. Safe for concurrent use.
type Ledger struct {
	cfg LedgerConfig

	mu     sync.Mutex
	out    *jsonlWriter
	rep    LedgerReport
	totals Totals
}

// OpenLedger creates cfg.Path.
func OpenLedger(cfg LedgerConfig) (*Ledger, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Start, cfg.MaxEvents = jsonlDefaults(cfg.Start, cfg.MaxEvents)
	if cfg.Mode == "" {
		cfg.Mode = ModeFiltered
	}
	out, err := openJSONL("egress ledger", cfg.Path, os.O_TRUNC, cfg.MaxEvents, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("creating egress ledger: %w", err)
	}
	l := &Ledger{cfg: cfg, out: out}
	rules := cfg.Rules
	if rules == nil {
		rules = []string{}
	}
	l.rep = LedgerReport{Mode: cfg.Mode, AllowedRules: rules, Allowed: []Entry{}, Denied: []Entry{},
		DNSQueries: []Entry{}, EgressLogPath: cfg.Path}
	return l, nil
}

// EntryOf turns an event into its record entry.
func EntryOf(ev Event, start time.Time) Entry {
	if ev.Time.IsZero() {
		ev.Time = time.Now()
	}
	e := Entry{TS: ev.Time.Sub(start).Milliseconds(), Proto: ev.Proto, Port: ev.Port, Allowed: ev.Allowed,
		Reason: ev.Reason, BytesUp: ev.BytesUp, BytesDown: ev.BytesDown, QType: ev.QType, Rcode: ev.Rcode,
		Error: ev.Error}
	if ev.Dst.IsValid() {
		e.Addr = ev.Dst.Unmap().String()
	}
	e.Host = RecordHost(ev.Host)
	if e.Host == "" {
		e.Host = e.Addr
	}
	if ev.Proto == ProtoDNS {
		e.Port, e.Addr = 0, ""
		if len(ev.Answers) > 0 {
			e.Answers = append([]string(nil), ev.Answers[:min(len(ev.Answers), MaxAnswers)]...)
		}
	}
	// A path's own "never forwarded" is, in this record, the non-TCP rule.
	if !ev.Allowed && ev.Reason == ReasonNotForwarded {
		e.Reason = ReasonNonTCP
	}
	if len(e.Error) > MaxErrLen {
		e.Error = e.Error[:MaxErrLen]
	}
	return e
}

// Record implements Recorder.
func (l *Ledger) Record(ev Event) {
	e := EntryOf(ev, l.cfg.Start)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.totals.Add(ev)
	l.rep.TotalEvents++
	if e.Proto == ProtoDNS {
		l.inline(&l.rep.DNSQueries, e)
	}
	switch {
	case !e.Allowed:
		l.inline(&l.rep.Denied, e)
	case e.Proto != ProtoDNS:
		l.inline(&l.rep.Allowed, e)
	}
	if !l.out.write(&e) {
		l.totals.Dropped++
	}
}

func (l *Ledger) inline(list *[]Entry, e Entry) {
	if len(*list) >= InlineCap {
		l.rep.Truncated = true
		return
	}
	*list = append(*list, e)
}

// Report returns the egress block so far.
func (l *Ledger) Report() LedgerReport {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.rep
	r.Allowed = append([]Entry{}, r.Allowed...)
	r.Denied = append([]Entry{}, r.Denied...)
	r.DNSQueries = append([]Entry{}, r.DNSQueries...)
	if l.totals.Dropped > 0 {
		r.Truncated = true
	}
	return r
}

// Totals returns the counts so far (the report's net block).
func (l *Ledger) Totals() Totals {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.totals
}

// Path is the file written.
func (l *Ledger) Path() string { return l.cfg.Path }

// Close flushes and closes the file; later events are only counted.
// Idempotent.
func (l *Ledger) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out.close()
}

// ReadEntries reads an egress record written by a Ledger.
func ReadEntries(r io.Reader) ([]Entry, error) {
	var out []Entry
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		var e Entry
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return nil, fmt.Errorf("egress record line %d: %v: %w", n, err, errdefs.ErrInvalidArgument)
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading egress record: %w", err)
	}
	return out, nil
}
