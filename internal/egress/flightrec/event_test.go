package flightrec

import (
	"encoding/json"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/egress"
)

// lineKeys returns the keys of a JSON object line, in order.
func lineKeys(t *testing.T, line string) []string {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(line))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("line %q is not an object: %v", line, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
	}
	return keys
}

// TestLineFormats pins the field names of both files: isopod egress suggest
// and scripts read them.
func TestLineFormats(t *testing.T) {
	full := Event{Time: time.Now(), Proto: egress.ProtoTCP, Dst: netip.MustParseAddr("203.0.113.10"), Port: 443,
		Host: "a.example", Allowed: true, Reason: egress.ReasonAllowedHost, Error: "e", QType: "A", Rcode: "NOERROR",
		Answers: []string{"203.0.113.10"}, BytesUp: 1, BytesDown: 2, DurationMS: 3}
	bare := Event{Proto: egress.ProtoICMP, Reason: egress.ReasonNotForwarded}
	for _, tt := range []struct {
		mode       string
		full, bare []string
	}{
		{ModeNAT,
			[]string{"ts_ms", "proto", "dst", "port", "host", "allowed", "reason", "error", "qtype", "rcode", "answers", "bytes_up", "bytes_down", "duration_ms"},
			[]string{"ts_ms", "proto", "dst", "allowed", "reason", "bytes_up", "bytes_down", "duration_ms"}},
		{ModeFiltered,
			[]string{"ts_ms", "proto", "host", "addr", "port", "allowed", "reason", "bytes_up", "bytes_down", "qtype", "rcode", "answers", "error"},
			[]string{"ts_ms", "proto", "host", "port", "allowed", "reason", "bytes_up", "bytes_down"}},
	} {
		path := filepath.Join(t.TempDir(), "log.jsonl")
		l, err := Open(Config{Path: path, Mode: tt.mode})
		if err != nil {
			t.Fatal(err)
		}
		l.Record(full)
		l.Record(bare)
		l.Close()
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 2 {
			t.Fatalf("%s: %d lines", tt.mode, len(lines))
		}
		if got := lineKeys(t, lines[0]); !slices.Equal(got, tt.full) {
			t.Errorf("%s line keys %v; want %v", tt.mode, got, tt.full)
		}
		if got := lineKeys(t, lines[1]); !slices.Equal(got, tt.bare) {
			t.Errorf("%s line keys of a bare event %v; want %v", tt.mode, got, tt.bare)
		}
		evs, err := ReadEvents(strings.NewReader(string(b)))
		if err != nil || len(evs) != 2 {
			t.Fatalf("%s: read back %d events, %v", tt.mode, len(evs), err)
		}
		if got := evs[0]; got.Dst != full.Dst || got.Host != full.Host || got.Port != full.Port || got.BytesDown != 2 || !got.Allowed {
			t.Errorf("%s: read back %+v", tt.mode, got)
		}
	}
}
