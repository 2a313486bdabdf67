// Package flightrectest keeps flight-recorder events in memory for tests
// of the code that records them (the proxy, the network stack), with waits
// bounded in time for records that follow a connection's close; and holds
// the conformance suite of a recorder (Run) that both flightrec.Log and
// the in-memory Recorder made by New pass.
package flightrectest

import (
	"sync"
	"time"

	"isopod/internal/egress/flightrec"
)

// patience bounds every wait: long enough for a loaded host, short enough
// that a missing record fails the test soon.
const patience = 5 * time.Second

// Recorder is a flightrec.Recorder that keeps events in memory. The zero
// value is ready to use and keeps every event as it was given; New makes
// one that keeps them as a flightrec.Log would write them.
type Recorder struct {
	cfg *flightrec.Config // nil: events kept as given, all of them

	mu     sync.Mutex // guards following
	evs    []flightrec.Event
	totals flightrec.Totals
}

var _ flightrec.Recorder = (*Recorder)(nil)

// New returns a Recorder that keeps events as a flightrec.Log opened with
// cfg writes them: shaped for cfg.Mode and stamped from cfg.Start (see
// flightrec.Config.Shape), at most cfg.MaxEvents of them, later ones only
// counted. cfg.Path and cfg.Rules are not used.
func New(cfg flightrec.Config) *Recorder {
	cfg = cfg.Defaults()
	return &Recorder{cfg: &cfg}
}

// Record keeps ev.
func (r *Recorder) Record(ev flightrec.Event) {
	if r.cfg != nil {
		ev = r.cfg.Shape(ev)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.totals.Add(ev)
	if r.cfg != nil && len(r.evs) >= r.cfg.MaxEvents {
		r.totals.Dropped++
		return
	}
	r.evs = append(r.evs, ev)
}

// Totals returns the counts so far.
func (r *Recorder) Totals() flightrec.Totals {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.totals
}

// Events returns a copy of the events so far.
func (r *Recorder) Events() []flightrec.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]flightrec.Event(nil), r.evs...)
}

// Reset forgets the events and totals so far and returns the events.
func (r *Recorder) Reset() []flightrec.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs, r.totals = nil, flightrec.Totals{}
	return out
}

// Wait returns the events once there are at least n, or all there are
// after a while.
func (r *Recorder) Wait(n int) []flightrec.Event {
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if evs := r.Events(); len(evs) >= n {
			return evs
		}
	}
	return r.Events()
}

// Find returns the first event that match accepts, or nil.
func (r *Recorder) Find(match func(flightrec.Event) bool) *flightrec.Event {
	for _, ev := range r.Events() {
		if match(ev) {
			return &ev
		}
	}
	return nil
}

// Await is Find waiting a while for the event to be recorded.
func (r *Recorder) Await(match func(flightrec.Event) bool) *flightrec.Event {
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if ev := r.Find(match); ev != nil {
			return ev
		}
	}
	return r.Find(match)
}

// Host matches the events for host.
func Host(host string) func(flightrec.Event) bool {
	return func(ev flightrec.Event) bool { return ev.Host == host }
}

// Reason matches the events with reason, and host when host is not empty.
func Reason(reason, host string) func(flightrec.Event) bool {
	return func(ev flightrec.Event) bool {
		return ev.Reason == reason && (host == "" || ev.Host == host)
	}
}
