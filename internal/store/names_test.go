package store

import "testing"

func TestVanityNames(t *testing.T) {
	id := "st-0123456789abcdef"
	base := baseName(id)
	if base != baseName(id) || base == "" {
		t.Fatalf("baseName is not deterministic: %q", base)
	}
	if other := baseName("st-fedcba9876543210"); other == base {
		t.Errorf("two ids share the name %q", base)
	}
	tests := []struct {
		name  string
		taken map[string]bool
		want  string
	}{
		{"free", nil, base},
		{"taken once", map[string]bool{base: true}, base + "-2"},
		{"taken twice", map[string]bool{base: true, base + "-2": true}, base + "-3"},
		{"unrelated names taken", map[string]bool{"x": true, base + "-2": true}, base},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := StageName(id, tc.taken); got != tc.want {
				t.Errorf("StageName = %q, want %q", got, tc.want)
			}
		})
	}
	seen := map[string]bool{}
	for i := range 200 {
		seen[baseName("st-"+hexID(uint64(i)*0x9e3779b97f4a7c15))] = true
	}
	if len(seen) < 150 {
		t.Errorf("200 ids gave only %d distinct names; the word lists are not used evenly", len(seen))
	}
}

func hexID(v uint64) string {
	const digits = "0123456789abcdef"
	b := make([]byte, 16)
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b)
}
