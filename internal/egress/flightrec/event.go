// Package flightrec is the flight recorder of a guest's network. Every
// network path (the userspace stack, the gateway's proxies and resolver)
// reports each flow it handled, allowed or not, as one [Event] to a
// [Recorder]. A [Log] writes them as JSON Lines, keeps the run's totals
// and, for a filtered run, builds the report's egress block.
//
// Two line formats exist, for the two kinds of run, and both are read by
// [ReadEvents]:
//
//   - NAT runs write vms/<id>/net.jsonl: ts_ms, proto, dst, port, host,
//     allowed, reason, error, qtype, rcode, answers, bytes_up, bytes_down,
//     duration_ms (empty ones omitted, as marked in [Event]).
//   - Filtered runs write vms/<id>/egress.jsonl, whose lines are also the
//     elements of the report's allowed and denied lists: ts_ms, proto,
//     host, addr, port, allowed, reason, bytes_up, bytes_down, qtype,
//     rcode, answers, error. Their host is always sanitised (see
//     egress.RecordHost), so no byte the guest chose reaches a report.
//
// A credential endpoint request (proto egress.ProtoCredential) adds, in
// both formats, alias, method, path, status, bytes (its response body's
// bytes, which are also its bytes_down) and note (the check that refused
// it); other lines carry none of them.
//
// Field names are a stable interface: isopod egress suggest and tests read
// them.
package flightrec

import (
	"encoding/json"
	"net/netip"
	"time"

	"isopod/internal/egress"
)

// Caps on one event's variable-size fields; a Log trims longer ones.
const (
	MaxErrLen  = 200
	MaxAnswers = 16
	MaxPathLen = 1024
)

// Event is one flow's record: a TCP connection, a UDP flow, a DNS query, a
// proxy request, or a refused packet.
type Event struct {
	// Time is when the flow began; the zero value means when recorded.
	Time time.Time
	// TS is Time in milliseconds since the recorder's start (the run's
	// start). A Log fills it; ReadEvents reads it.
	TS int64

	Proto   string     // egress.ProtoTCP, ProtoUDP, ProtoDNS, ProtoICMP, ProtoHTTPProxy, ProtoSOCKS
	Dst     netip.Addr // the destination address, when one was involved
	Port    uint16
	Host    string // a name, when one is known
	Allowed bool
	Reason  string // one of the egress Reason constants
	Error   string // how an allowed flow failed

	// DNS only.
	QType   string
	Rcode   string
	Answers []string

	BytesUp    int64 // guest to destination
	BytesDown  int64 // destination to guest
	DurationMS int64

	// Credential endpoint requests only. Path is the normalised request
	// path without its query; Note names the check that refused it.
	Alias  string
	Method string
	Path   string
	Status int
	Note   string
}

// Recorder receives flow records. Record must be safe for concurrent use and
// must not block for long: it is called from the network path.
type Recorder interface {
	Record(ev Event)
}

// natLine is a line of net.jsonl.
type natLine struct {
	TS         int64      `json:"ts_ms"`
	Proto      string     `json:"proto"`
	Dst        netip.Addr `json:"dst"`
	Port       uint16     `json:"port,omitempty"`
	Host       string     `json:"host,omitempty"`
	Allowed    bool       `json:"allowed"`
	Reason     string     `json:"reason,omitempty"`
	Error      string     `json:"error,omitempty"`
	QType      string     `json:"qtype,omitempty"`
	Rcode      string     `json:"rcode,omitempty"`
	Answers    []string   `json:"answers,omitempty"`
	BytesUp    int64      `json:"bytes_up"`
	BytesDown  int64      `json:"bytes_down"`
	DurationMS int64      `json:"duration_ms"`
	credLine
}

// ledgerLine is a line of egress.jsonl and an element of a report list.
type ledgerLine struct {
	TS        int64    `json:"ts_ms"`
	Proto     string   `json:"proto"`
	Host      string   `json:"host"`
	Addr      string   `json:"addr,omitempty"`
	Port      uint16   `json:"port"`
	Allowed   bool     `json:"allowed"`
	Reason    string   `json:"reason"`
	BytesUp   int64    `json:"bytes_up"`
	BytesDown int64    `json:"bytes_down"`
	QType     string   `json:"qtype,omitempty"`
	Rcode     string   `json:"rcode,omitempty"`
	Answers   []string `json:"answers,omitempty"`
	Error     string   `json:"error,omitempty"`
	credLine
}

// credLine is what a credential endpoint request adds to either line.
type credLine struct {
	Alias  string `json:"alias,omitempty"`
	Method string `json:"method,omitempty"`
	Path   string `json:"path,omitempty"`
	Status int    `json:"status,omitempty"`
	Bytes  *int64 `json:"bytes,omitempty"`
	Note   string `json:"note,omitempty"`
}

// credLine is ev's credential fields; none unless ev is a credential
// endpoint request.
func (ev *Event) credLine() credLine {
	if ev.Proto != egress.ProtoCredential {
		return credLine{}
	}
	n := ev.BytesDown
	return credLine{Alias: ev.Alias, Method: ev.Method, Path: ev.Path, Status: ev.Status, Bytes: &n, Note: ev.Note}
}

func (ev *Event) natLine() natLine {
	return natLine{TS: ev.TS, Proto: ev.Proto, Dst: ev.Dst, Port: ev.Port, Host: ev.Host, Allowed: ev.Allowed,
		Reason: ev.Reason, Error: ev.Error, QType: ev.QType, Rcode: ev.Rcode, Answers: ev.Answers,
		BytesUp: ev.BytesUp, BytesDown: ev.BytesDown, DurationMS: ev.DurationMS, credLine: ev.credLine()}
}

func (ev *Event) ledgerLine() ledgerLine {
	l := ledgerLine{TS: ev.TS, Proto: ev.Proto, Host: ev.Host, Port: ev.Port, Allowed: ev.Allowed, Reason: ev.Reason,
		BytesUp: ev.BytesUp, BytesDown: ev.BytesDown, QType: ev.QType, Rcode: ev.Rcode, Answers: ev.Answers, Error: ev.Error,
		credLine: ev.credLine()}
	if ev.Dst.IsValid() {
		l.Addr = ev.Dst.String()
	}
	return l
}

// MarshalJSON writes ev as a line of egress.jsonl (the form of the report's
// lists).
func (ev Event) MarshalJSON() ([]byte, error) { return json.Marshal(ev.ledgerLine()) }

// UnmarshalJSON reads a line of either format.
func (ev *Event) UnmarshalJSON(b []byte) error {
	var l struct {
		ledgerLine
		Dst        netip.Addr `json:"dst"`
		DurationMS int64      `json:"duration_ms"`
	}
	if err := json.Unmarshal(b, &l); err != nil {
		return err
	}
	*ev = Event{TS: l.TS, Proto: l.Proto, Dst: l.Dst, Port: l.Port, Host: l.Host, Allowed: l.Allowed, Reason: l.Reason,
		Error: l.Error, QType: l.QType, Rcode: l.Rcode, Answers: l.Answers, BytesUp: l.BytesUp, BytesDown: l.BytesDown,
		DurationMS: l.DurationMS, Alias: l.Alias, Method: l.Method, Path: l.Path, Status: l.Status, Note: l.Note}
	if !ev.Dst.IsValid() && l.Addr != "" {
		a, err := netip.ParseAddr(l.Addr)
		if err != nil {
			return err
		}
		ev.Dst = a
	}
	return nil
}

// Attempt is what egress.Suggest reads of ev.
func (ev *Event) Attempt() egress.Attempt {
	return egress.Attempt{Proto: ev.Proto, Host: ev.Host, Port: ev.Port, Allowed: ev.Allowed, Reason: ev.Reason, QType: ev.QType}
}

// Attempts turns events into egress.Suggest's input.
func Attempts(evs []Event) []egress.Attempt {
	out := make([]egress.Attempt, len(evs))
	for i := range evs {
		out[i] = evs[i].Attempt()
	}
	return out
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
