package flightrectest

import (
	"encoding/json"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/egress/flightrec"
)

// testFields checks what a reader gets back of each kind of event: in
// ModeNAT the fields as recorded, long ones trimmed; in ModeFiltered the
// host as egress.RecordHost shows it (a malformed name as <invalid:N>, an
// address when there is no name), no address or port for DNS, "never
// forwarded" as the non-TCP rule, no duration.
func testFields(t *testing.T, mode string, s Subject) {
	dst := netip.MustParseAddr("203.0.113.10")
	gw := netip.MustParseAddr("10.0.2.3")
	meta := netip.MustParseAddr("169.254.169.254")
	far := netip.MustParseAddr("198.51.100.7")
	answers := repeat("203.0.113.10", flightrec.MaxAnswers+10)
	in := []flightrec.Event{
		{Time: at(10), Proto: egress.ProtoTCP, Dst: dst, Port: 443, Host: "Example.COM.", Allowed: true,
			Reason: egress.ReasonAllowedHost, BytesUp: 100, BytesDown: 2000, DurationMS: 12},
		{Time: at(20), Proto: egress.ProtoDNS, Dst: gw, Port: 53, Host: "example.com", Allowed: true,
			Reason: egress.ReasonAllowedHost, QType: "A", Rcode: "NOERROR", Answers: answers},
		{Time: at(30), Proto: egress.ProtoTCP, Dst: meta, Port: 80, Reason: egress.ReasonLinkLocal},
		{Time: at(40), Proto: egress.ProtoUDP, Dst: far, Port: 9999, Host: "bad host\x1b", Reason: egress.ReasonNotForwarded,
			Error: long(flightrec.MaxErrLen + 100)},
		{Time: at(50), Proto: egress.ProtoTCP, Dst: dst, Port: 443, Host: strings.Repeat("a", 400), Reason: egress.ReasonNotAllowed},
	}
	for _, ev := range in {
		s.Record(ev)
	}
	trimmed := answers[:flightrec.MaxAnswers]
	errMsg := long(flightrec.MaxErrLen)
	want := []flightrec.Event{
		{TS: 10, Proto: egress.ProtoTCP, Dst: dst, Port: 443, Host: "Example.COM.", Allowed: true,
			Reason: egress.ReasonAllowedHost, BytesUp: 100, BytesDown: 2000, DurationMS: 12},
		{TS: 20, Proto: egress.ProtoDNS, Dst: gw, Port: 53, Host: "example.com", Allowed: true,
			Reason: egress.ReasonAllowedHost, QType: "A", Rcode: "NOERROR", Answers: trimmed},
		{TS: 30, Proto: egress.ProtoTCP, Dst: meta, Port: 80, Reason: egress.ReasonLinkLocal},
		{TS: 40, Proto: egress.ProtoUDP, Dst: far, Port: 9999, Host: "bad host\x1b", Reason: egress.ReasonNotForwarded, Error: errMsg},
		{TS: 50, Proto: egress.ProtoTCP, Dst: dst, Port: 443, Host: strings.Repeat("a", egress.MaxHostLen), Reason: egress.ReasonNotAllowed},
	}
	if mode == flightrec.ModeFiltered {
		want[0].Host, want[0].DurationMS = "example.com", 0
		want[1].Dst, want[1].Port = netip.Addr{}, 0
		want[2].Host = meta.String()
		want[3].Host, want[3].Reason = egress.InvalidHost(len("bad host\x1b")), egress.ReasonNonTCP
		want[4].Host = egress.InvalidHost(400)
	}
	sameEvents(t, s.Events(), want)
	if mode == flightrec.ModeFiltered {
		for _, ev := range s.Events() {
			if strings.ContainsAny(ev.Host, "\x1b ") {
				t.Errorf("host %q reached a filtered record", ev.Host)
			}
		}
	}
}

// testCredential checks credential endpoint requests: their alias,
// method, path, status and note come back as recorded, a path over
// flightrec.MaxPathLen trimmed; in ModeFiltered a refusal is listed in
// the report's denied entries and a served request in its allowed ones.
func testCredential(t *testing.T, mode string, s Subject) {
	in := []flightrec.Event{
		{Time: at(1), Proto: egress.ProtoCredential, Host: "api.example", Port: 443, Allowed: true, Reason: egress.ReasonCredentialAllowed,
			BytesUp: 3, BytesDown: 70, Alias: "gh", Method: "POST", Path: "/repos/a/b/issues", Status: 201},
		{Time: at(2), Proto: egress.ProtoCredential, Host: "api.example", Port: 443, Reason: egress.ReasonCredentialRefused,
			Alias: "gh", Method: "GET", Path: "/" + long(flightrec.MaxPathLen+10), Status: 403, Note: "not_permitted"},
	}
	for _, ev := range in {
		s.Record(ev)
	}
	want := []flightrec.Event{in[0], in[1]}
	for i := range want {
		want[i].Time, want[i].TS = time.Time{}, int64(i+1)
	}
	want[1].Path = want[1].Path[:flightrec.MaxPathLen]
	sameEvents(t, s.Events(), want)
	r, ok := s.(Reporter)
	if !ok || mode != flightrec.ModeFiltered {
		return
	}
	rep := r.Report()
	sameEvents(t, rep.Allowed, want[:1])
	sameEvents(t, rep.Denied, want[1:])
}

// testReport checks a filtered run's egress block: the rules, the refused
// and allowed flows, the distinct names asked for, the totals, the file;
// lists capped at flightrec.InlineCap and marked truncated past it. A
// recorder in ModeNAT has none.
func testReport(t *testing.T, mode string, s Subject, cfg flightrec.Config) {
	r, ok := s.(Reporter)
	if !ok {
		t.Skip("this recorder builds no report block")
	}
	if mode != flightrec.ModeFiltered {
		if rep := r.Report(); rep != nil {
			t.Errorf("report %+v in mode %s; want none", rep, mode)
		}
		return
	}
	checkEmptyReport(t, r.Report())
	dst := netip.MustParseAddr("203.0.113.10")
	s.Record(flightrec.Event{Time: at(1), Proto: egress.ProtoDNS, Host: "a.example", QType: "A", Allowed: true, Reason: egress.ReasonAllowedHost})
	s.Record(flightrec.Event{Time: at(2), Proto: egress.ProtoDNS, Host: "evil\x1b.example", QType: "A", Reason: egress.ReasonInvalidName})
	s.Record(flightrec.Event{Time: at(3), Proto: egress.ProtoDNS, Host: "A.Example.", QType: "AAAA", Allowed: true, Reason: egress.ReasonAllowedHost})
	s.Record(flightrec.Event{Time: at(4), Proto: egress.ProtoTCP, Dst: dst, Port: 443, Host: "a.example", Allowed: true, Reason: egress.ReasonAllowedHost})
	s.Record(flightrec.Event{Time: at(5), Proto: egress.ProtoICMP, Dst: netip.MustParseAddr("8.8.8.8"), Reason: egress.ReasonNotForwarded})
	rep := r.Report()
	evs := s.Events()
	if rep.Mode != flightrec.ModeFiltered || !slices.Equal(rep.AllowedRules, cfg.Rules.Strings()) || rep.EgressLogPath != cfg.Path ||
		rep.TotalEvents != 5 || rep.Truncated {
		t.Errorf("report mode %s rules %q path %s total %d truncated %v; want %s %q %s 5 false",
			rep.Mode, rep.AllowedRules, rep.EgressLogPath, rep.TotalEvents, rep.Truncated, flightrec.ModeFiltered, cfg.Rules.Strings(), cfg.Path)
	}
	if want := []string{"a.example", egress.InvalidHost(len("evil\x1b.example"))}; !slices.Equal(rep.DNSQueries, want) {
		t.Errorf("dns_queries %q; want %q", rep.DNSQueries, want)
	}
	if len(evs) == 5 {
		sameEvents(t, rep.Allowed, evs[3:4])
		sameEvents(t, rep.Denied, []flightrec.Event{evs[1], evs[4]})
	}
	for range flightrec.InlineCap {
		s.Record(flightrec.Event{Time: at(6), Proto: egress.ProtoTCP, Dst: dst, Port: 80, Reason: egress.ReasonLiteral})
	}
	if rep := r.Report(); len(rep.Denied) != flightrec.InlineCap || !rep.Truncated || rep.TotalEvents != 5+flightrec.InlineCap {
		t.Errorf("after %d refusals: %d listed, truncated %v, total %d; want %d, true, %d", flightrec.InlineCap+2,
			len(rep.Denied), rep.Truncated, rep.TotalEvents, flightrec.InlineCap, 5+flightrec.InlineCap)
	}
}

// checkEmptyReport checks the block of a run with no flows: every key,
// every list empty rather than null.
func checkEmptyReport(t *testing.T, rep *flightrec.Report) {
	t.Helper()
	if rep == nil {
		t.Fatal("no report in filtered mode")
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"mode": flightrec.ModeFiltered, "allowed_rules": []any{"host:a.example"}, "allowed": []any{},
		"denied": []any{}, "dns_queries": []any{}, "total_events": 0.0, "truncated": false, "egress_log_path": rep.EgressLogPath}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("empty report %s; want %v", b, want)
	}
}
