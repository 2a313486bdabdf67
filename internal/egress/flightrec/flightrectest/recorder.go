// Package flightrectest keeps flight-recorder events in memory for tests
// of the code that records them (the proxy, the network stack), with waits
// bounded in time for records that follow a connection's close.
package flightrectest

import (
	"sync"
	"time"

	"isopod/internal/egress/flightrec"
)

// patience bounds every wait: long enough for a loaded host, short enough
// that a missing record fails the test soon.
const patience = 5 * time.Second

// Recorder is a flightrec.Recorder that keeps every event. The zero value
// is ready to use.
type Recorder struct {
	mu  sync.Mutex
	evs []flightrec.Event
}

var _ flightrec.Recorder = (*Recorder)(nil)

// Record keeps ev.
func (r *Recorder) Record(ev flightrec.Event) {
	r.mu.Lock()
	r.evs = append(r.evs, ev)
	r.mu.Unlock()
}

// Events returns a copy of the events so far.
func (r *Recorder) Events() []flightrec.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]flightrec.Event(nil), r.evs...)
}

// Reset forgets the events so far and returns them.
func (r *Recorder) Reset() []flightrec.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.evs
	r.evs = nil
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
