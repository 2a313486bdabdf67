package qemu

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAccelVerdict: the verdict the doctor gets names the host's obstacle
// and its fix, and the last probe guest's outcome, in whole sentences.
func TestAccelVerdict(t *testing.T) {
	cache := filepath.Join(t.TempDir(), "accel-probe.json")
	at := time.Unix(1e9, 0).UTC()
	for _, tt := range []struct {
		name     string
		facts    kvmFacts
		rec      *probeRecord
		obstacle string // "" : none
		probe    string // "" : no probe; "ok" : a good one; else in its reason
	}{
		{name: "healthy, never probed", facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o666, "kvm", 993)}},
		{name: "no hardware virtualization", facts: kvmFacts{}, obstacle: "There is no /dev/kvm"},
		{name: "probed fine", facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o666, "kvm", 993)},
			rec: &probeRecord{Key: "k", KVM: true, At: at}, probe: "ok"},
		{name: "probe failed", facts: kvmFacts{CPUFlag: "vmx", Dev: kvmNode(0o666, "kvm", 993)},
			rec: &probeRecord{Key: "k", Reason: "\nfailed to set MSR 0x10a\nassertion failed", At: at}, probe: "The probe guest failed: failed to set MSR 0x10a."},
	} {
		t.Run(tt.name, func(t *testing.T) {
			os.Remove(cache)
			if tt.rec != nil {
				b, _ := json.Marshal(tt.rec)
				if err := os.WriteFile(cache, b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			d := &Driver{probeCache: cache, kvmFacts: func() kvmFacts { return tt.facts }}
			v := d.AccelVerdict(t.Context())
			if !strings.Contains(v.Obstacle, tt.obstacle) || (tt.obstacle == "") != (v.Obstacle == "") {
				t.Errorf("obstacle %q; want %q", v.Obstacle, tt.obstacle)
			}
			if v.Obstacle != "" {
				assertSentence(t, v.Obstacle)
				assertSentence(t, v.Fix)
			}
			switch {
			case tt.probe == "" && v.Probe != nil:
				t.Errorf("probe %+v; want none", v.Probe)
			case tt.probe == "":
			case v.Probe == nil || !v.Probe.At.Equal(at):
				t.Errorf("probe %+v; want one at %v", v.Probe, at)
			case tt.probe == "ok" && (!v.Probe.OK || v.Probe.Reason != ""):
				t.Errorf("probe %+v; want ok", v.Probe)
			case tt.probe != "ok" && (v.Probe.OK || v.Probe.Reason != tt.probe):
				t.Errorf("probe %+v; want failed with %q", v.Probe, tt.probe)
			}
		})
	}
}
