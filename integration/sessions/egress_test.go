package sessions

import (
	"encoding/json"
	"os"
	"testing"

	"isopod/integration/e2e"
	"isopod/internal/egress/flightrec"
	"isopod/internal/testnet"
)

// A filtered session's egress record covers every exec of its life, a
// pause and resume included: each allowed fetch and each refused one is
// in it, and the stop's final report gives the summary and the record.
func TestSessionEgressRecord(t *testing.T) {
	e2e.RequireVM(t)
	t.Parallel()
	n := testnet.New(t)
	n.ServeHTTP(t, n.Public, testnet.PublicIP+":80", nil)
	ns := func(args ...string) *e2e.Result {
		t.Helper()
		r := e2e.NSIsopod(t, n, args...)
		if r.Code != 0 || r.JSON["ok"] != true {
			t.Fatalf("isopod %v:\n%s", args, r)
		}
		return r
	}
	id := e2e.Str(ns("session", "start", "--allow-host", "test.example").JSON, "session_id")
	t.Cleanup(func() { e2e.Isopod(t, nil, "session", "stop", id) })
	fetch := func(host string) int64 {
		t.Helper()
		r := ns("session", "exec", id, "--", "sh", "-c", "wget -q -T 5 -O /dev/null http://"+host+testnet.HelloPath)
		return exitCode(t, r)
	}
	if code := fetch("test.example"); code != 0 {
		t.Errorf("the allowed host: exit %d", code)
	}
	if code := fetch("other.example"); code == 0 {
		t.Error("a host not allowed was fetched")
	}
	ns("session", "pause", id)
	if code := fetch("test.example"); code != 0 {
		t.Errorf("the allowed host after a resume: exit %d", code)
	}
	fin := ns("session", "stop", id)
	var rep struct {
		Egress *flightrec.Report `json:"egress"`
	}
	if err := json.Unmarshal(fin.Stdout, &rep); err != nil || rep.Egress == nil || rep.Egress.EgressLogPath == "" {
		t.Fatalf("the stop's report has no egress summary: %s", fin)
	}
	f, err := os.Open(rep.Egress.EgressLogPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	events, err := flightrec.ReadEvents(f)
	if err != nil {
		t.Fatal(err)
	}
	allowed, denied := 0, 0
	for _, e := range events {
		switch {
		case e.Allowed && e.Host == "test.example" && e.Port == 80:
			allowed++
		case !e.Allowed && e.Host == "other.example":
			denied++
		}
	}
	if allowed < 2 || denied < 1 {
		t.Errorf("the record has %d allowed fetches of test.example (want 2: before and after the pause) and %d refusals of other.example (want 1):\n%+v", allowed, denied, events)
	}
}
