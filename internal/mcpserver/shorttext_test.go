package mcpserver

import (
	"strconv"
	"strings"
	"testing"
)

// TestShortText: a message quoting a huge value keeps its words and its
// end, and shows a short head of the value and its size.
func TestShortText(t *testing.T) {
	huge := strings.Repeat("v", 300<<10)
	spaced := strings.Repeat("a b ", 50<<10)
	tests := []struct {
		name, msg string
		want      []string
	}{
		{"short stays", `stage "x" not found`, []string{`stage "x" not found`}},
		{"a long path stays", `copy_out "` + strings.Repeat("/dir", 50) + `": refused`, []string{strings.Repeat("/dir", 50)}},
		{"quoted", `no stage matches ` + strconv.Quote(huge) + ` (see stage_list). Fix: check the name.`,
			[]string{`no stage matches "` + huge[:maxShown] + `"... (307200 bytes) (see stage_list). Fix: check the name.`}},
		{"unquoted word", `stage ` + huge + ` not found. Fix: check the name.`,
			[]string{`stage ` + huge[:maxShown] + `... (307200 bytes) not found. Fix: check the name.`}},
		{"spaced text keeps the fix", `stage ` + spaced + ` not found. Fix: check the name.`,
			[]string{`stage a b a b`, `bytes cut) ... `, ` not found. Fix: check the name.`}},
		{"an unclosed quote", `bad "` + huge, []string{`bad "` + huge[:maxShown-1]}},
	}
	for _, tt := range tests {
		got := shortText(tt.msg)
		if len(got) > maxErrorMessage {
			t.Errorf("%s: %d bytes", tt.name, len(got))
		}
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %.300q does not hold %.100q", tt.name, got, w)
			}
		}
	}
}
