package supervisor

import (
	"encoding/json"
	"log/slog"
	"net"
	"testing"

	"isopod/internal/session"
)

// A call that comes while the session pauses or stops is turned away as
// unavailable (a caller resumes and calls again), not cut short.
func TestCallWhileEndingIsTurnedAway(t *testing.T) {
	s := &sup{o: Options{ID: "ss-000000000000"}, log: slog.New(slog.DiscardHandler),
		stop: make(chan struct{}), ended: make(chan struct{})}
	s.requestPause("test")
	a, b := net.Pipe()
	defer b.Close()
	go s.handle(a)
	if err := json.NewEncoder(b).Encode(session.Call{Op: session.OpPing}); err != nil {
		t.Fatal(err)
	}
	var ans session.Answer
	if err := json.NewDecoder(b).Decode(&ans); err != nil {
		t.Fatal(err)
	}
	if ans.OK || ans.Class != "unavailable" || s.active != 0 {
		t.Errorf("answer %+v, %d calls counted; want unavailable, none", ans, s.active)
	}
}
