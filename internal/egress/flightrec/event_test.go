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

// TestCredentialLine pins what a credential endpoint request adds to both
// line formats: alias, method, path, status, bytes (also when 0) and note,
// read back as recorded; a line of another proto carries none of them.
func TestCredentialLine(t *testing.T) {
	served := Event{Proto: egress.ProtoCredential, Host: "api.example", Port: 443, Allowed: true,
		Reason: egress.ReasonCredentialAllowed, BytesUp: 5, BytesDown: 1234, Alias: "gh", Method: "GET", Path: "/repos/x", Status: 200}
	refused := Event{Proto: egress.ProtoCredential, Host: "api.example", Port: 443, Reason: egress.ReasonCredentialRefused,
		Alias: "gh", Method: "DELETE", Path: "/repos/x", Status: 403, Note: "not_permitted"}
	other := Event{Proto: egress.ProtoTCP, Port: 443, Host: "a.example", Allowed: true, Reason: egress.ReasonAllowedHost,
		Alias: "ignored", Method: "GET", Path: "/p", Status: 200, Note: "n"}
	for _, tt := range []struct {
		mode           string
		served, refuse []string
	}{
		{ModeNAT,
			[]string{"ts_ms", "proto", "dst", "port", "host", "allowed", "reason", "bytes_up", "bytes_down", "duration_ms", "alias", "method", "path", "status", "bytes"},
			[]string{"ts_ms", "proto", "dst", "port", "host", "allowed", "reason", "bytes_up", "bytes_down", "duration_ms", "alias", "method", "path", "status", "bytes", "note"}},
		{ModeFiltered,
			[]string{"ts_ms", "proto", "host", "port", "allowed", "reason", "bytes_up", "bytes_down", "alias", "method", "path", "status", "bytes"},
			[]string{"ts_ms", "proto", "host", "port", "allowed", "reason", "bytes_up", "bytes_down", "alias", "method", "path", "status", "bytes", "note"}},
	} {
		path := filepath.Join(t.TempDir(), "log.jsonl")
		l, err := Open(Config{Path: path, Mode: tt.mode})
		if err != nil {
			t.Fatal(err)
		}
		l.Record(served)
		l.Record(refused)
		l.Record(other)
		l.Close()
		b, _ := os.ReadFile(path)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) != 3 {
			t.Fatalf("%s: %d lines", tt.mode, len(lines))
		}
		for i, want := range [][]string{tt.served, tt.refuse} {
			if got := lineKeys(t, lines[i]); !slices.Equal(got, want) {
				t.Errorf("%s: credential line keys %v; want %v", tt.mode, got, want)
			}
		}
		if !strings.Contains(lines[0], `"bytes":1234`) || !strings.Contains(lines[1], `"bytes":0`) {
			t.Errorf("%s: bytes missing: %s", tt.mode, b)
		}
		for _, k := range []string{"alias", "method", "path", "status", "bytes", "note"} {
			if slices.Contains(lineKeys(t, lines[2]), k) {
				t.Errorf("%s: a tcp line carries %q: %s", tt.mode, k, lines[2])
			}
		}
		evs, err := ReadEvents(strings.NewReader(string(b)))
		if err != nil || len(evs) != 3 {
			t.Fatalf("%s: read back %d events, %v", tt.mode, len(evs), err)
		}
		got := evs[1]
		if got.Alias != "gh" || got.Method != "DELETE" || got.Path != "/repos/x" || got.Status != 403 || got.Note != "not_permitted" ||
			got.Reason != egress.ReasonCredentialRefused || got.Host != "api.example" {
			t.Errorf("%s: read back %+v", tt.mode, got)
		}
	}
}
