package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDoctorFirstUse: on an empty state root, isopod doctor prints its one
// JSON report with ok:false, names what failed, gives each image check the
// command that builds it, and exits 1; with ISOPOD_JAIL=off the jail passes.
func TestDoctorFirstUse(t *testing.T) {
	t.Setenv("ISOPOD_JAIL", "off")
	code, m, stderr := runCLI(t, "doctor")
	if code != 1 || m == nil {
		t.Fatalf("exit %d, report %v (stderr %q); want exit 1 and a report", code, m, stderr)
	}
	if m["ok"] != false || m["class"] != "failed_precondition" || !strings.Contains(m["error"].(string), "kernel") {
		t.Errorf("ok %v, class %v, error %v; want false, failed_precondition, naming the kernel", m["ok"], m["class"], m["error"])
	}
	checks := map[string]map[string]any{}
	for _, c := range m["checks"].([]any) {
		c := c.(map[string]any)
		checks[c["name"].(string)] = c
	}
	for name, fix := range map[string]string{
		"kernel": "isopod image fetch-kernel",
		"base":   "isopod image build base-min",
	} {
		c := checks[name]
		if c == nil || c["ok"] != false || c["required"] != true || c["fix"] != fix {
			t.Errorf("%s: %v; want a failed required check with fix %q", name, c, fix)
		}
	}
	if c := checks["jail"]; c == nil || c["ok"] != true {
		t.Errorf("jail with ISOPOD_JAIL=off: %v; want ok", c)
	}
	// doctor reads; it makes no state root.
	if _, err := os.Stat(filepath.Join(os.Getenv("ISOPOD_HOME"), "kernels")); err == nil {
		t.Error("doctor created kernels/ in the state root")
	}
}
