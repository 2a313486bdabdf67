package sandbox_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/doctor"
	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	"isopod/internal/settings"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// TestVMMDrivers: the core knows the qemu driver, the default, and
// refuses any other name before anything starts, naming the known ones.
func TestVMMDrivers(t *testing.T) {
	if got := sandbox.VMMDrivers(); !slices.Equal(got, []string{"qemu"}) || sandbox.DefaultVMM != "qemu" {
		t.Fatalf("drivers %q, default %q; want qemu", got, sandbox.DefaultVMM)
	}
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", "qemu"} {
		s, err := sandbox.New(sandbox.Options{Settings: settings.Settings{Paths: p, VMM: name}})
		if err != nil {
			t.Fatalf("VMM %q: %v", name, err)
		}
		s.Close()
	}
	_, err = sandbox.New(sandbox.Options{Settings: settings.Settings{Paths: p, VMM: "firecracker"}})
	if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "use qemu") || !strings.Contains(err.Error(), "ISOPOD_VMM") {
		t.Fatalf("VMM firecracker: %v; want invalid argument naming ISOPOD_VMM and qemu", err)
	}
}

// TestDoctorThroughProber: `isopod doctor` learns the VMM's machine and
// its verdict on KVM from the core's driver through vmm.Prober, here the
// fake one, and names no driver to get them.
func TestDoctorThroughProber(t *testing.T) {
	at := time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)
	for _, tt := range []struct {
		name    string
		verdict vmm.AccelVerdict
		kvm     string // in the kvm check's why
	}{
		{"obstacle", vmm.AccelVerdict{Obstacle: "The fake host has no KVM at all.", Fix: "Use another fake host."},
			"KVM cannot be used. The fake host has no KVM at all."},
		{"failed probe", vmm.AccelVerdict{Probe: &vmm.AccelProbe{Reason: "The fake guest never ran.", At: at}},
			"(last probe, 2026-01-02 03:04 UTC). The fake guest never ran."},
		{"never probed", vmm.AccelVerdict{}, "the first run probes"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s, _ := newFakeService(t, vmmfake.Config{AccelVerdict: tt.verdict})
			h := doctor.Host{
				LookPath: func(name string) (string, error) { return "/usr/bin/" + name, nil },
				QEMUVersion: func(context.Context, string) (string, error) {
					return "QEMU emulator version 7.2.19\n", nil
				},
				OpenKVM: func() error { return nil },
				VMM:     s.Prober,
			}
			r := doctor.Run(t.Context(), doctor.Config{Home: t.TempDir()}, h)
			for _, c := range r.Checks {
				switch c.Name {
				case "qemu":
					if !c.OK || c.Detail["machine_options"] != vmmfake.Name || !strings.Contains(c.Why, "no machine or firmware") {
						t.Errorf("qemu check %+v; want the fake's machine", c)
					}
				case "kvm":
					if !strings.Contains(c.Why, tt.kvm) {
						t.Errorf("kvm check says %q; want %q", c.Why, tt.kvm)
					}
					if tt.verdict.Obstacle != "" && c.Fix != tt.verdict.Fix {
						t.Errorf("kvm fix %q; want %q", c.Fix, tt.verdict.Fix)
					}
				}
			}
		})
	}
}
