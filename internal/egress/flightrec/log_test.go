package flightrec

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/egress"
	"isopod/internal/errdefs"
)

func readEvents(t *testing.T, path string) []Event {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var evs []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var ev Event
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}

func TestLogRecords(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.jsonl")
	start := time.Now().Add(-time.Second)
	l, err := Open(Config{Path: path, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Time: start.Add(250 * time.Millisecond), Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"),
		Port: 80, Allowed: true, Reason: egress.ReasonPublic, BytesUp: 100, BytesDown: 5000, DurationMS: 12})
	l.Record(Event{Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("169.254.169.254"), Port: 80, Reason: egress.ReasonLinkLocal})
	l.Record(Event{Proto: egress.ProtoDNS, Host: strings.Repeat("a", 400), QType: "A", Allowed: true,
		Answers: make([]string, 40), Error: strings.Repeat("e", 1000)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Proto: egress.ProtoUDP, Allowed: true, BytesUp: 1}) // after Close: counted only
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	got := l.Totals()
	want := Totals{Flows: 4, Denied: 1, BytesUp: 101, BytesDown: 5000, Dropped: 1}
	if got != want {
		t.Errorf("totals %+v; want %+v", got, want)
	}
	evs := readEvents(t, path)
	if len(evs) != 3 {
		t.Fatalf("%d lines; want 3", len(evs))
	}
	if evs[0].TS != 250 || evs[0].Dst.String() != "203.0.113.10" || evs[0].BytesDown != 5000 || !evs[0].Allowed {
		t.Errorf("first event %+v", evs[0])
	}
	if evs[1].Allowed || evs[1].Reason != egress.ReasonLinkLocal || evs[1].TS < 900 {
		t.Errorf("second event %+v; want refused link_local about 1s in", evs[1])
	}
	if len(evs[2].Host) != egress.MaxHostLen || len(evs[2].Answers) != MaxAnswers || len(evs[2].Error) != MaxErrLen {
		t.Errorf("third event not trimmed: host %d answers %d error %d", len(evs[2].Host), len(evs[2].Answers), len(evs[2].Error))
	}
}

func TestLogCapAndConcurrency(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.jsonl")
	l, err := Open(Config{Path: path, MaxEvents: 50})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const workers, each = 8, 40
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				l.Record(Event{Proto: egress.ProtoTCP, Allowed: i%2 == 0, Port: uint16(w), BytesUp: 1, BytesDown: 2})
			}
		}()
	}
	wg.Wait()
	got := l.Totals()
	want := Totals{Flows: workers * each, Denied: workers * each / 2, BytesUp: workers * each, BytesDown: 2 * workers * each,
		Dropped: workers*each - 50}
	if got != want {
		t.Errorf("totals %+v; want %+v", got, want)
	}
	if evs := readEvents(t, path); len(evs) != 50 {
		t.Errorf("%d lines written; want the cap, 50", len(evs))
	}
}

func TestLogConfigValidate(t *testing.T) {
	for _, c := range []Config{{}, {Path: "/x", MaxEvents: -1}} {
		if _, err := Open(c); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("Open(%+v) = %v; want ErrInvalidArgument", c, err)
		}
	}
	if _, err := Open(Config{Path: filepath.Join(t.TempDir(), "missing", "net.jsonl")}); err == nil {
		t.Error("Open in a missing directory succeeded")
	}
}

func TestFilteredLog(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	start := time.Now()
	rules, err := egress.ParseRules(egress.Switches{AllowHosts: []string{"a.example"}})
	if err != nil {
		t.Fatal(err)
	}
	l, err := Open(Config{Path: path, Mode: ModeFiltered, Start: start, Rules: rules})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Time: start.Add(5 * time.Millisecond), Proto: egress.ProtoDNS, Dst: netip.MustParseAddr("10.0.2.1"), Port: 53,
		Host: "a.example", QType: "A", Allowed: true, Reason: egress.ReasonAllowedHost, Rcode: "NOERROR", Answers: []string{"203.0.113.10"}})
	l.Record(Event{Proto: egress.ProtoDNS, Host: "evil\x1b]0;pwned\x07.example", QType: "A", Reason: egress.ReasonInvalidName, Rcode: "NXDOMAIN"})
	l.Record(Event{Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"), Port: 443, Host: "a.example", Allowed: true,
		Reason: egress.ReasonAllowedHost, BytesUp: 10, BytesDown: 20})
	l.Record(Event{Proto: egress.ProtoICMP, Dst: netip.MustParseAddr("8.8.8.8"), Reason: egress.ReasonNotForwarded})
	for i := range 100 {
		l.Record(Event{Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.99"), Port: uint16(1000 + i), Reason: egress.ReasonLiteral})
	}
	rep := *l.Report()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if rep.Mode != ModeFiltered || rep.TotalEvents != 104 || !rep.Truncated || len(rep.Denied) != InlineCap ||
		len(rep.Allowed) != 1 || len(rep.DNSQueries) != 2 || rep.EgressLogPath != path {
		t.Errorf("report: mode %s total %d truncated %v denied %d allowed %d dns %d", rep.Mode, rep.TotalEvents, rep.Truncated,
			len(rep.Denied), len(rep.Allowed), len(rep.DNSQueries))
	}
	if !slices.Equal(rep.DNSQueries, []string{"a.example", "<invalid:22>"}) {
		t.Errorf("dns_queries %q", rep.DNSQueries)
	}
	if d := rep.Denied[0]; d.Host != "<invalid:22>" || d.Reason != egress.ReasonInvalidName || d.Port != 0 {
		t.Errorf("hostile name entry %+v", d)
	}
	if d := rep.Denied[1]; d.Proto != egress.ProtoICMP || d.Reason != egress.ReasonNonTCP || d.Host != "8.8.8.8" {
		t.Errorf("icmp entry %+v", d)
	}
	b, _ := os.ReadFile(path)
	if bytes.ContainsAny(b, "\x1b\x07") {
		t.Error("raw control bytes reached the record file")
	}
	f, _ := os.Open(path)
	defer f.Close()
	entries, err := ReadEvents(f)
	if err != nil || len(entries) != 104 {
		t.Fatalf("file has %d entries, %v; want all 104", len(entries), err)
	}
	js, _ := json.Marshal(rep)
	for _, key := range []string{`"allowed_rules":["host:a.example"]`, `"bytes_up":10`, `"ts_ms":`, `"egress_log_path"`} {
		if !bytes.Contains(js, []byte(key)) {
			t.Errorf("report JSON lacks %s", key)
		}
	}
}

// TestReportDNSQueries: dns_queries is the distinct names asked for, in
// first-asked order, capped like the other lists; the queries themselves
// stay in denied and in the file.
func TestReportDNSQueries(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	l, err := Open(Config{Path: path, Mode: ModeFiltered})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	query := func(name, qtype string, allowed bool) {
		reason := egress.ReasonAllowedHost
		if !allowed {
			reason = egress.ReasonNotAllowed
		}
		l.Record(Event{Proto: egress.ProtoDNS, Host: name, QType: qtype, Allowed: allowed, Reason: reason})
	}
	for _, name := range []string{"b.example", "a.example", "B.Example."} {
		query(name, "A", true)
		query(name, "AAAA", true)
	}
	query("blocked.example", "A", false)
	query("blocked.example", "AAAA", false)
	l.Record(Event{Proto: egress.ProtoDNS, Host: egress.MalformedHost, Reason: egress.ReasonMalformed, Rcode: "FORMERR"})
	rep := l.Report()
	if want := []string{"b.example", "a.example", "blocked.example"}; !slices.Equal(rep.DNSQueries, want) || rep.Truncated {
		t.Errorf("dns_queries %q truncated %v; want %q, not truncated", rep.DNSQueries, rep.Truncated, want)
	}
	if len(rep.Allowed) != 0 || len(rep.Denied) != 3 || rep.Denied[2].Host != egress.MalformedHost {
		t.Errorf("allowed %v denied %v; want no allowed and the three refused queries", rep.Allowed, rep.Denied)
	}
	js, _ := json.Marshal(rep)
	if !bytes.Contains(js, []byte(`"dns_queries":["b.example","a.example","blocked.example"]`)) {
		t.Errorf("report JSON %s", js)
	}

	for i := range InlineCap + 10 {
		query(fmt.Sprintf("n%d.example", i), "A", true)
	}
	rep = l.Report()
	if len(rep.DNSQueries) != InlineCap || !rep.Truncated || rep.DNSQueries[3] != "n0.example" {
		t.Errorf("after %d names: %d listed, truncated %v", InlineCap+13, len(rep.DNSQueries), rep.Truncated)
	}
	if rep.TotalEvents != 9+InlineCap+10 {
		t.Errorf("total_events %d", rep.TotalEvents)
	}
}

// TestReportNotTruncatedByRepeats: asking for listed names again, however
// often, does not truncate the list.
func TestReportNotTruncatedByRepeats(t *testing.T) {
	l, err := Open(Config{Path: filepath.Join(t.TempDir(), "egress.jsonl"), Mode: ModeFiltered})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := range 1000 {
		l.Record(Event{Proto: egress.ProtoDNS, Host: fmt.Sprintf("n%d.example", i%InlineCap), QType: "A", Allowed: true,
			Reason: egress.ReasonAllowedHost})
	}
	if rep := l.Report(); len(rep.DNSQueries) != InlineCap || rep.Truncated {
		t.Errorf("%d names listed, truncated %v; want %d, false", len(rep.DNSQueries), rep.Truncated, InlineCap)
	}
}

// TestDNSNeverTheGateway: a DNS record names what was asked, or a
// placeholder; never the gateway the message was sent to.
func TestDNSNeverTheGateway(t *testing.T) {
	l, err := Open(Config{Path: filepath.Join(t.TempDir(), "egress.jsonl"), Mode: ModeFiltered})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	gw := netip.MustParseAddr("10.0.2.1")
	l.Record(Event{Proto: egress.ProtoDNS, Dst: gw, Port: 53, Reason: egress.ReasonMalformed})
	l.Record(Event{Proto: egress.ProtoDNS, Dst: gw, Port: 53, Host: egress.MalformedHost, Reason: egress.ReasonMalformed})
	for _, d := range l.Report().Denied {
		if d.Host != egress.MalformedHost || d.Dst.IsValid() || d.Port != 0 {
			t.Errorf("DNS entry %+v; want host %s, no address, port 0", d, egress.MalformedHost)
		}
	}
}

// TestLogContinue: a filtered log starts afresh, unless it continues a VM
// resumed after a pause.
func TestLogContinue(t *testing.T) {
	path := filepath.Join(t.TempDir(), "egress.jsonl")
	write := func(cont bool) {
		t.Helper()
		l, err := Open(Config{Path: path, Mode: ModeFiltered, Continue: cont})
		if err != nil {
			t.Fatal(err)
		}
		l.Record(Event{Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"), Port: 443, Reason: egress.ReasonNotAllowed})
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(false)
	write(true)
	if n := len(readEvents(t, path)); n != 2 {
		t.Errorf("%d lines after a continued log; want 2", n)
	}
	write(false)
	if n := len(readEvents(t, path)); n != 1 {
		t.Errorf("%d lines after a fresh log; want 1", n)
	}
}
