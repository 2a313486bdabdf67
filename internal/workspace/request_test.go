//go:build linux

package workspace

import (
	"testing"
)

func TestLinksOutWarning(t *testing.T) {
	tests := []struct {
		links []string
		want  string
	}{
		{[]string{"abs"}, `the workspace patch /p makes 1 symlink(s) pointing outside the repository ("abs"); check them before applying it`},
		{[]string{"a", "b", "c", "d", "e", "f", "g"},
			`the workspace patch /p makes 7 symlink(s) pointing outside the repository ("a", "b", "c", "d", "e" and 2 more); check them before applying it`},
	}
	for _, tt := range tests {
		if got := LinksOutWarning("/p", tt.links); got != tt.want {
			t.Errorf("LinksOutWarning(%q) =\n%s\nwant\n%s", tt.links, got, tt.want)
		}
	}
}
