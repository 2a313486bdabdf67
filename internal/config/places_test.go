package config

import (
	"errors"
	"strings"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/vmm"
)

func TestPlaces(t *testing.T) {
	home := t.TempDir()
	for _, tt := range []struct {
		env            map[string]string
		maxVMs, budget int
		lifetime       int
		bad            string // the variable an error names; "": accepted
	}{
		{env: map[string]string{}, lifetime: DefaultSessionMaxLifetimeS},
		{env: map[string]string{knobs.MaxVMs: "1", knobs.MemoryBudgetMiB: "4096", knobs.SessionMaxLifetimeS: "60"}, maxVMs: 1, budget: 4096, lifetime: 60},
		{env: map[string]string{knobs.MaxVMs: "-1"}, bad: knobs.MaxVMs},
		{env: map[string]string{knobs.MaxVMs: "many"}, bad: knobs.MaxVMs},
		{env: map[string]string{knobs.MemoryBudgetMiB: "1.5"}, bad: knobs.MemoryBudgetMiB},
		{env: map[string]string{knobs.SessionMaxLifetimeS: "0"}, bad: knobs.SessionMaxLifetimeS},
	} {
		tt.env[knobs.Home] = home
		s, err := Load(env(tt.env))
		if tt.bad != "" {
			if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.bad) {
				t.Errorf("%v: %v, want invalid_argument naming %s", tt.env, err, tt.bad)
			}
			continue
		}
		if err != nil {
			t.Errorf("%v: %v", tt.env, err)
			continue
		}
		if s.MaxVMs != tt.maxVMs || s.MemoryBudgetMiB != tt.budget || s.SessionMaxLifetimeS != tt.lifetime {
			t.Errorf("%v: max VMs %d, budget %d, lifetime %d", tt.env, s.MaxVMs, s.MemoryBudgetMiB, s.SessionMaxLifetimeS)
		}
		c := s.Admission(vmm.AccelTCG)
		if tt.maxVMs > 0 && (c.MaxVMs != tt.maxVMs || c.Queue != 4*tt.maxVMs || c.MemoryBudgetMiB != tt.budget) {
			t.Errorf("%v: admission %+v", tt.env, c)
		}
	}
}
