package flightrec_test

import (
	"os"
	"testing"

	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/flightrec/flightrectest"
)

// logSubject reads a Log's record back from its file.
type logSubject struct {
	*flightrec.Log
	t *testing.T
}

// Events reads the file as a reader of the record does.
func (s logSubject) Events() []flightrec.Event {
	s.t.Helper()
	f, err := os.Open(s.Path())
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	evs, err := flightrec.ReadEvents(f)
	if err != nil {
		s.t.Fatalf("reading %s: %v", s.Path(), err)
	}
	return evs
}

// TestConformance runs the recorder's conformance suite on the Log.
func TestConformance(t *testing.T) {
	flightrectest.Run(t, flightrectest.Target{
		New: func(t *testing.T, cfg flightrec.Config) flightrectest.Subject {
			l, err := flightrec.Open(cfg)
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			t.Cleanup(func() {
				if err := l.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			})
			return logSubject{l, t}
		},
	})
}
