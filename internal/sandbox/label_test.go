package sandbox_test

import (
	"context"
	"strings"
	"testing"

	"isopod/internal/sandbox"
	"isopod/internal/transfer"
)

// TestOneLabelRule: run --commit-as and stage pull --as accept and refuse
// the same labels, the store's rule for new labels.
func TestOneLabelRule(t *testing.T) {
	for _, tt := range []struct {
		label string
		ok    bool
	}{
		{"myproj/deps", true},
		{"a-b_c.d", true},
		{"émigré", true},
		{"base2", true},
		{"st", true},
		{"rust/st-x", true},
		{strings.Repeat("x", 128), true},
		{"a b", false},
		{" lead", false},
		{"trail ", false},
		{"tab\tx", false},
		{"nl\nx", false},
		{"nbsp\u00a0x", false},
		{"-x", false},
		{"base", false},
		{"st-0123456789abcdef", false},
		{"st-mine", false},
		{strings.Repeat("x", 129), false},
		{"bad\xffutf8", false},
	} {
		t.Run(tt.label, func(t *testing.T) {
			_, commitErr := sandbox.Normalize(sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CommitAs: tt.label})
			// The label is checked before the source: with none, a
			// label the rule takes fails on the source instead.
			_, pullErr := transfer.Client{}.PullStage(context.Background(), transfer.PullRequest{As: tt.label})
			commitOK := commitErr == nil
			pullOK := pullErr == nil || !strings.HasPrefix(pullErr.Error(), "--as:")
			if commitOK != tt.ok || pullOK != tt.ok {
				t.Errorf("--commit-as %q: %v; --as: %v; want both accepted = %v", tt.label, commitErr, pullErr, tt.ok)
			}
		})
	}
}
