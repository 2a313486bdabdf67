package flightrectest_test

import (
	"testing"

	"isopod/internal/egress/flightrec"
	"isopod/internal/egress/flightrec/flightrectest"
)

// TestConformance runs the recorder's conformance suite on the in-memory
// Recorder.
func TestConformance(t *testing.T) {
	flightrectest.Run(t, flightrectest.Target{
		New: func(t *testing.T, cfg flightrec.Config) flightrectest.Subject { return flightrectest.New(cfg) },
	})
}
