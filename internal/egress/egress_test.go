package egress

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

func TestCategory(t *testing.T) {
	tests := []struct {
		addr string
		want string
	}{
		{"8.8.8.8", CatPublic},
		{"1.1.1.1", CatPublic},
		{"203.0.113.10", CatPublic}, // documentation ranges are public on purpose
		{"198.51.100.10", CatPublic},
		{"192.0.2.1", CatPublic},
		{"10.0.0.1", CatPrivate},
		{"10.255.255.255", CatPrivate},
		{"172.16.0.1", CatPrivate},
		{"172.31.255.254", CatPrivate},
		{"172.32.0.1", CatPublic},
		{"192.168.77.10", CatPrivate},
		{"100.64.0.1", CatCGNAT},
		{"100.127.255.254", CatCGNAT},
		{"100.128.0.1", CatPublic},
		{"127.0.0.1", CatLoopback},
		{"127.8.9.10", CatLoopback},
		{"169.254.169.254", CatLinkLocal},
		{"169.254.0.1", CatLinkLocal},
		{"224.0.0.251", CatMulticast},
		{"239.255.255.250", CatMulticast},
		{"0.0.0.0", CatUnspecified},
		{"0.1.2.3", CatUnspecified},
		{"255.255.255.255", CatBroadcast},
		{"240.0.0.1", CatReserved},
		{"::ffff:10.1.2.3", CatPrivate}, // v4-mapped judged as v4
		{"::ffff:127.0.0.1", CatLoopback},
		{"::ffff:169.254.169.254", CatLinkLocal},
		{"::ffff:8.8.8.8", CatPublic},
		{"64:ff9b::a9fe:a9fe", CatLinkLocal}, // NAT64 of 169.254.169.254
		{"64:ff9b::808:808", CatPublic},
		{"2606:4700::1111", CatPublic},
		{"2001:db8::1", CatPublic},
		{"fd00::1", CatPrivate},
		{"fc00::1", CatPrivate},
		{"fec0::1", CatPrivate},
		{"fe80::1", CatLinkLocal},
		{"::1", CatLoopback},
		{"::", CatUnspecified},
		{"ff02::1", CatMulticast},
		{"100::1", CatReserved},
	}
	for _, tt := range tests {
		if got := Category(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Category(%s) = %q; want %q", tt.addr, got, tt.want)
		}
	}
	if got := Category(netip.Addr{}); got != CatInvalid {
		t.Errorf("Category(zero) = %q; want %q", got, CatInvalid)
	}
}

func TestPublicOnly(t *testing.T) {
	host := []netip.Addr{netip.MustParseAddr("192.0.2.2"), netip.MustParseAddr("10.9.9.9")}
	tests := []struct {
		dst      string
		allowLAN bool
		allow    bool
		reason   string
	}{
		{"203.0.113.10", false, true, ReasonPublic},
		{"192.168.77.10", false, false, ReasonPrivate},
		{"192.168.77.10", true, true, ReasonLANAllowed},
		{"100.64.1.1", false, false, ReasonCGNAT},
		{"100.64.1.1", true, true, ReasonLANAllowed},
		{"fd12::1", false, false, ReasonPrivate},
		{"fd12::1", true, true, ReasonLANAllowed},
		// Always refused, AllowLAN or not.
		{"169.254.169.254", true, false, ReasonLinkLocal},
		{"127.0.0.1", true, false, ReasonLoopback},
		{"::1", true, false, ReasonLoopback},
		{"fe80::1", true, false, ReasonLinkLocal},
		{"224.0.0.251", true, false, ReasonMulticast},
		{"0.0.0.0", true, false, ReasonUnspecified},
		{"255.255.255.255", true, false, ReasonBroadcast},
		{"240.1.1.1", true, false, ReasonReserved},
		{"192.0.2.2", true, false, ReasonHost},        // public range, but the host's own
		{"::ffff:192.0.2.2", true, false, ReasonHost}, // mapped form too
		{"10.9.9.9", true, false, ReasonHost},         // host beats AllowLAN
	}
	for _, tt := range tests {
		p := &PublicOnly{AllowLAN: tt.allowLAN, HostAddrs: host}
		for _, proto := range []string{ProtoTCP, ProtoUDP} {
			f := Flow{Proto: proto, Dst: netip.AddrPortFrom(netip.MustParseAddr(tt.dst), 443)}
			v := p.Decide(f)
			if v.Allow != tt.allow || v.Reason != tt.reason {
				t.Errorf("%s %s lan=%v: got allow=%v reason=%q; want allow=%v reason=%q",
					proto, tt.dst, tt.allowLAN, v.Allow, v.Reason, tt.allow, tt.reason)
			}
			if v.Dial.IsValid() || v.Sniff {
				t.Errorf("%s %s: PublicOnly set Dial %v / Sniff %v", proto, tt.dst, v.Dial, v.Sniff)
			}
		}
	}
	v := (&PublicOnly{}).Decide(Flow{Proto: ProtoDNS, Host: "example.com", QType: "A"})
	if !v.Allow || v.Reason != ReasonDNS {
		t.Errorf("DNS query: got %+v; want allowed", v)
	}
}

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
	l, err := OpenLog(LogConfig{Path: path, Start: start})
	if err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Time: start.Add(250 * time.Millisecond), Proto: ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"),
		Port: 80, Allowed: true, Reason: ReasonPublic, BytesUp: 100, BytesDown: 5000, DurationMS: 12})
	l.Record(Event{Proto: ProtoTCP, Dst: netip.MustParseAddr("169.254.169.254"), Port: 80, Reason: ReasonLinkLocal})
	l.Record(Event{Proto: ProtoDNS, Host: strings.Repeat("a", 400), QType: "A", Allowed: true,
		Answers: make([]string, 40), Error: strings.Repeat("e", 1000)})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l.Record(Event{Proto: ProtoUDP, Allowed: true, BytesUp: 1}) // after Close: counted only
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
	if evs[1].Allowed || evs[1].Reason != ReasonLinkLocal || evs[1].TS < 900 {
		t.Errorf("second event %+v; want refused link_local about 1s in", evs[1])
	}
	if len(evs[2].Host) != MaxHostLen || len(evs[2].Answers) != MaxAnswers || len(evs[2].Error) != MaxErrLen {
		t.Errorf("third event not trimmed: host %d answers %d error %d", len(evs[2].Host), len(evs[2].Answers), len(evs[2].Error))
	}
}

func TestLogCapAndConcurrency(t *testing.T) {
	path := filepath.Join(t.TempDir(), "net.jsonl")
	l, err := OpenLog(LogConfig{Path: path, MaxEvents: 50})
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
				l.Record(Event{Proto: ProtoTCP, Allowed: i%2 == 0, Port: uint16(w), BytesUp: 1, BytesDown: 2})
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
	for _, c := range []LogConfig{{}, {Path: "/x", MaxEvents: -1}} {
		if _, err := OpenLog(c); !errors.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("OpenLog(%+v) = %v; want ErrInvalidArgument", c, err)
		}
	}
	if _, err := OpenLog(LogConfig{Path: filepath.Join(t.TempDir(), "missing", "net.jsonl")}); err == nil {
		t.Error("OpenLog in a missing directory succeeded")
	}
}
