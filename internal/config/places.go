package config

import (
	"fmt"
	"strconv"
	"strings"

	"isopod/internal/admission"
	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/ledger"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
)

// DefaultSessionMaxLifetimeS caps a session's lifetime unless set.
const DefaultSessionMaxLifetimeS = 86400

// parsePlaces reads the host-wide VM limits and the sessions' lifetime
// cap.
func parsePlaces(raw map[string]string, s *Settings) error {
	count := func(name string, lo, hi int, want string) (int, error) {
		v := strings.TrimSpace(raw[name])
		if v == "" {
			return 0, nil
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < lo || n > hi {
			return 0, fmt.Errorf("%s=%q: want %s: %w", name, v, want, errdefs.ErrInvalidArgument)
		}
		return n, nil
	}
	var err error
	if s.MaxVMs, err = count(knobs.MaxVMs, 0, 1024, "a number of VMs from 1 to 1024 (0 or unset: from the host's cores and memory)"); err != nil {
		return err
	}
	if s.MemoryBudgetMiB, err = count(knobs.MemoryBudgetMiB, 0, 1<<30, "a number of MiB (0 or unset: MemTotal less an eighth)"); err != nil {
		return err
	}
	if s.SessionMaxLifetimeS, err = count(knobs.SessionMaxLifetimeS, 1, 1<<31-1, "a number of seconds from 1"); err != nil {
		return err
	}
	if s.SessionMaxLifetimeS == 0 {
		s.SessionMaxLifetimeS = DefaultSessionMaxLifetimeS
	}
	return nil
}

// Admission is the limits of this host's VMs under accel: its defaults
// (sandbox.DefaultAdmission), with ISOPOD_MAX_VMS and
// ISOPOD_MEMORY_BUDGET_MIB over them. The queue is four times the VM
// limit.
func (s Settings) Admission(accel vmm.Accel) admission.Config {
	c := sandbox.DefaultAdmission(admission.ReadHost(), accel)
	if s.MemoryBudgetMiB > 0 {
		c.MemoryBudgetMiB = s.MemoryBudgetMiB
	}
	if s.MaxVMs > 0 {
		c.MaxVMs = s.MaxVMs
		c.Queue = 4 * s.MaxVMs
	}
	return c
}

// Ledger opens this process's handle on the state root's ledger,
// labelled label (what the process is, for listings).
func (s Settings) Ledger(label string) (*ledger.Ledger, error) {
	h := ledger.Self(label)
	l, err := ledger.Open(s.Paths.Ledger(), h)
	if err != nil {
		return nil, fmt.Errorf("opening the VM places' ledger: %w", err)
	}
	return l, nil
}
