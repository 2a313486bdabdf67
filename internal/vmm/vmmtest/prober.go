package vmmtest

import (
	"context"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"isopod/internal/vmm"
)

// testProber checks what a driver tells `isopod doctor` without starting
// a guest: its build and machine, and its verdict on hardware
// acceleration, in whole sentences.
func testProber(t *testing.T, drv vmm.Driver) {
	p, ok := drv.(vmm.Prober)
	if !ok {
		t.Fatalf("%T is no vmm.Prober: the doctor cannot ask it about the host", drv)
	}
	ctx := context.Background()
	info, err := drv.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	m, err := p.Machine(ctx)
	if err != nil {
		t.Fatalf("Machine: %v", err)
	}
	if m.Info != info {
		t.Errorf("Machine names %+v; Info says %+v", m.Info, info)
	}
	if m.Options == "" {
		t.Error("Machine gives no options")
	}
	AssertSentences(t, "Machine's why", m.Why)
	t.Logf("%s %s: %s; %s", info.Name, info.Version, m.Options, m.Why)

	v := p.AccelVerdict(ctx)
	if (v.Obstacle == "") != (v.Fix == "") {
		t.Errorf("obstacle %q with fix %q: want both or neither", v.Obstacle, v.Fix)
	}
	if v.Obstacle != "" {
		AssertSentences(t, "obstacle", v.Obstacle)
		AssertSentences(t, "fix", v.Fix)
	}
	if pr := v.Probe; pr != nil {
		t.Logf("last probe at %v: ok %v; %s", pr.At, pr.OK, pr.Reason)
		if pr.At.IsZero() {
			t.Error("a probe with no time")
		}
		if !pr.OK {
			AssertSentences(t, "probe reason", pr.Reason)
		}
	}
	t.Logf("accel obstacle %q, fix %q", v.Obstacle, v.Fix)
}

// AssertSentences fails unless s is whole sentences: a capital first
// letter and a full stop at the end.
func AssertSentences(t *testing.T, what, s string) {
	t.Helper()
	r, _ := utf8.DecodeRuneInString(s)
	if s == "" || !unicode.IsUpper(r) || !strings.HasSuffix(s, ".") {
		t.Errorf("%s %q is not whole sentences", what, s)
	}
}
