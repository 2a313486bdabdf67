package flightrectest

import (
	"fmt"
	"net/netip"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// Subject is a recorder under test as its users see it: the network path
// records, the run's report reads the totals, and a reader gets the record
// back.
type Subject interface {
	flightrec.Recorder
	Totals() flightrec.Totals
	// Events returns what a reader of the record gets back, in order.
	Events() []flightrec.Event
}

// Reporter is a Subject that builds a filtered run's egress block, as
// flightrec.Log does.
type Reporter interface {
	Report() *flightrec.Report
}

// Target is a recorder implementation under test.
type Target struct {
	// New returns a recorder configured by cfg; cfg.Path is a fresh file
	// in a test directory.
	New func(t *testing.T, cfg flightrec.Config) Subject
}

// start is the runs' start in the suite: fixed, so timestamps are exact.
var start = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// at is start plus ms milliseconds.
func at(ms int) time.Time { return start.Add(time.Duration(ms) * time.Millisecond) }

// Run runs the conformance checks against tg, in both modes.
func Run(t *testing.T, tg Target) {
	for _, mode := range []string{flightrec.ModeNAT, flightrec.ModeFiltered} {
		t.Run(mode, func(t *testing.T) {
			config := func(t *testing.T, maxEvents int) flightrec.Config {
				rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"a.example"}})
				if err != nil {
					t.Fatal(err)
				}
				return flightrec.Config{Path: filepath.Join(t.TempDir(), mode+".jsonl"), Mode: mode, Start: start,
					Rules: rules, MaxEvents: maxEvents}
			}
			open := func(t *testing.T, maxEvents int) Subject { return tg.New(t, config(t, maxEvents)) }
			t.Run("Order", func(t *testing.T) { testOrder(t, open(t, 0)) })
			t.Run("Concurrent", func(t *testing.T) { testConcurrent(t, open(t, 0)) })
			t.Run("Cap", func(t *testing.T) { testCap(t, open(t, 5)) })
			t.Run("Fields", func(t *testing.T) { testFields(t, mode, open(t, 0)) })
			t.Run("Credential", func(t *testing.T) { testCredential(t, mode, open(t, 0)) })
			t.Run("Report", func(t *testing.T) {
				cfg := config(t, 0)
				testReport(t, mode, tg.New(t, cfg), cfg)
			})
		})
	}
}

// flow is a plain allowed TCP flow, numbered by its port.
func flow(port int, allowed bool) flightrec.Event {
	reason := egress.ReasonPublic
	if !allowed {
		reason = egress.ReasonLinkLocal
	}
	return flightrec.Event{Time: at(port), Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"),
		Port: uint16(port), Allowed: allowed, Reason: reason, BytesUp: int64(port), BytesDown: 2 * int64(port)}
}

// testOrder checks that events come back in the order recorded, stamped
// from the run's start, and are counted.
func testOrder(t *testing.T, s Subject) {
	const n = 20
	var want flightrec.Totals
	for i := 1; i <= n; i++ {
		ev := flow(i, i%3 != 0)
		s.Record(ev)
		want.Add(ev)
	}
	evs := s.Events()
	if len(evs) != n {
		t.Fatalf("%d events back; want %d", len(evs), n)
	}
	for i, ev := range evs {
		if int(ev.Port) != i+1 || ev.TS != int64(i+1) || ev.Allowed != ((i+1)%3 != 0) {
			t.Errorf("event %d: port %d ts %d allowed %v; want port and ts %d, in order", i, ev.Port, ev.TS, ev.Allowed, i+1)
		}
	}
	if got := s.Totals(); got != want {
		t.Errorf("totals %+v; want %+v", got, want)
	}
}

// testConcurrent checks Record from several goroutines at once: every
// event kept once, each goroutine's in its order, all counted.
func testConcurrent(t *testing.T, s Subject) {
	const workers, each = 8, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				s.Record(flightrec.Event{Time: at(i), Proto: egress.ProtoUDP, Port: uint16(w + 1), Allowed: i%2 == 0,
					Reason: egress.ReasonPublic, BytesUp: int64(i), BytesDown: 1})
			}
		})
	}
	wg.Wait()
	evs := s.Events()
	if len(evs) != workers*each {
		t.Fatalf("%d events back; want %d", len(evs), workers*each)
	}
	next := map[uint16]int64{}
	for _, ev := range evs {
		if ev.BytesUp != next[ev.Port] {
			t.Fatalf("worker %d: event %d after %d; want each worker's events in order", ev.Port, ev.BytesUp, next[ev.Port]-1)
		}
		next[ev.Port]++
	}
	want := flightrec.Totals{Flows: workers * each, Denied: workers * each / 2,
		BytesUp: workers * each * (each - 1) / 2, BytesDown: workers * each}
	if got := s.Totals(); got != want {
		t.Errorf("totals %+v; want %+v", got, want)
	}
}

// testCap checks MaxEvents: the first events are kept, later ones only
// counted, as dropped.
func testCap(t *testing.T, s Subject) {
	const n = 12
	for i := 1; i <= n; i++ {
		s.Record(flow(i, true))
	}
	evs := s.Events()
	if len(evs) != 5 {
		t.Fatalf("%d events back with MaxEvents 5; want 5", len(evs))
	}
	if evs[0].Port != 1 || evs[4].Port != 5 {
		t.Errorf("kept ports %d..%d; want the first five, 1..5", evs[0].Port, evs[4].Port)
	}
	want := flightrec.Totals{Flows: n, BytesUp: n * (n + 1) / 2, BytesDown: n * (n + 1), Dropped: n - 5}
	if got := s.Totals(); got != want {
		t.Errorf("totals %+v; want %+v", got, want)
	}
}

// sameEvents compares events field by field, an empty list and none
// being the same.
func sameEvents(t *testing.T, got, want []flightrec.Event) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%d events back; want %d", len(got), len(want))
	}
	for i := range got {
		g, w := got[i], want[i]
		if len(g.Answers) == 0 && len(w.Answers) == 0 {
			g.Answers, w.Answers = nil, nil
		}
		if !reflect.DeepEqual(g, w) {
			t.Errorf("event %d:\n got %s\nwant %s", i, describe(g), describe(w))
		}
	}
}

// describe prints an event with its long fields summarised.
func describe(ev flightrec.Event) string {
	host := ev.Host
	if len(host) > 40 {
		host = fmt.Sprintf("%s... (%d bytes)", host[:20], len(host))
	}
	return fmt.Sprintf("ts %d %s %v:%d host %q allowed %v reason %s error %d bytes qtype %s rcode %s answers %d up %d down %d dur %d",
		ev.TS, ev.Proto, ev.Dst, ev.Port, host, ev.Allowed, ev.Reason, len(ev.Error), ev.QType, ev.Rcode, len(ev.Answers),
		ev.BytesUp, ev.BytesDown, ev.DurationMS)
}

// repeat returns n copies of s.
func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// long is a string of n bytes.
func long(n int) string { return strings.Repeat("e", n) }
