package store

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// plantStage writes a stage's meta.json by hand, for ids a test needs to
// share a prefix (content ids cannot be chosen).
func plantStage(t *testing.T, s *Store, id, label string) Meta {
	t.Helper()
	m := Meta{ID: id, Name: baseName(id), Label: label, Chain: []string{id}, BaseFlavor: testFlavor,
		Created: time.Unix(1700000000, 0).UTC(), CreatedUnix: 1700000000}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(s.Dir(), id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(s.metaPath(id), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestResolveIDPrefix(t *testing.T) {
	s := newStore(t)
	deps := mustCommit(t, s, req(smallLayer(t, 1), "proj/deps", ""))
	twinA := plantStage(t, s, "st-abcdef0100000000", "twin/a")
	plantStage(t, s, "st-abcdef0200000000", "twin/b")
	hexID := strings.TrimPrefix(deps.ID, IDPrefix)

	found := []struct {
		name, ref string
		want      Meta
	}{
		{"st- and the fewest hex digits", deps.ID[:len(IDPrefix)+MinIDPrefix], deps},
		{"bare hex digits", hexID[:MinIDPrefix], deps},
		{"upper-case hex digits", strings.ToUpper(hexID[:MinIDPrefix+2]), deps},
		{"the whole id without st-", hexID, deps},
		{"a prefix that tells the twins apart", "st-abcdef01", twinA},
	}
	for _, tc := range found {
		t.Run(tc.name, func(t *testing.T) {
			m, err := s.Resolve(tc.ref)
			if err != nil {
				t.Fatal(err)
			}
			if m.ID != tc.want.ID {
				t.Errorf("Resolve(%q) = %s, want %s", tc.ref, m.ID, tc.want.ID)
			}
		})
	}

	refused := []struct {
		name, ref string
		class     error
		subs      []string
	}{
		{"ambiguous id prefix", "st-abcdef", errdefs.ErrInvalidArgument,
			[]string{"ambiguous", "twin/a (st-abcdef0100000000)", "twin/b (st-abcdef0200000000)"}},
		{"ambiguous bare prefix", "abcdef0", errdefs.ErrInvalidArgument, []string{"ambiguous", "twin/a", "twin/b"}},
		{"st- and too few hex digits", deps.ID[:len(IDPrefix)+MinIDPrefix-1], errdefs.ErrInvalidArgument,
			[]string{"too short", "at least 4 hex digits"}},
		{"too few bare hex digits", hexID[:MinIDPrefix-1], errdefs.ErrNotFound, []string{"no stage matches"}},
		{"no such id", "st-0000000", errdefs.ErrNotFound, []string{"no stage matches", "isopod stage list"}},
		{"more digits than an id", hexID + "0", errdefs.ErrNotFound, nil},
	}
	for _, tc := range refused {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Resolve(tc.ref)
			wantErr(t, err, tc.class, tc.subs...)
		})
	}
}

func TestResolveAmbiguousListsFew(t *testing.T) {
	s := newStore(t)
	for i := range 8 {
		plantStage(t, s, "st-abcdef000000000"+string(rune('0'+i)), "many/"+string(rune('a'+i)))
	}
	_, err := s.Resolve("st-abcdef")
	wantErr(t, err, errdefs.ErrInvalidArgument, "ambiguous", "and 3 more")
	if n := strings.Count(err.Error(), "st-abcdef"); n != 1+maxCandidates {
		t.Errorf("error names %d ids, want the reference and %d candidates: %v", n, maxCandidates, err)
	}
}

// TestResolveLabelsOfOlderRules: a stage stored under a label the rule for
// new labels now refuses (a space, an st- prefix) is still found by it.
func TestResolveLabelsOfOlderRules(t *testing.T) {
	s := newStore(t)
	for i, label := range []string{"my deps", "st-mine"} {
		if err := ValidateLabel(label); err == nil {
			t.Fatalf("ValidateLabel(%q) accepts it; the test wants a label the rule refuses", label)
		}
		id := "st-0000000000000" + string(rune('a'+i)) + "00"
		planted := plantStage(t, s, id, label)
		m, err := s.Resolve(label)
		if err != nil || m.ID != planted.ID {
			t.Errorf("Resolve(%q) = %s, %v; want %s", label, m.ID, err, planted.ID)
		}
	}
}
