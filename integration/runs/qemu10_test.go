package runs

import (
	"os"
	"slices"
	"strings"
	"testing"

	"isopod/integration/e2e"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmtest"
)

// TestRunQEMU10: a whole `isopod run`, jailed, on QEMU 10.0 (Debian 13's,
// whose microvm firmware is SeaBIOS), chosen with ISOPOD_QEMU; and
// `isopod doctor` says which firmware and machine options it gets.
func TestRunQEMU10(t *testing.T) {
	e2e.RequireVM(t)
	bin := vmmtest.QEMU10(t)
	env := []string{"ISOPOD_QEMU=" + bin, "ISOPOD_WARM_POOL=off"}
	r := e2e.Isopod(t, env, "run", "--no-network", "--", "cat", "/proc/version")
	if r.Code != 0 || r.JSON["ok"] != true {
		t.Fatalf("isopod run on %s failed:\n%s", bin, r)
	}
	if got := e2e.Str(r.JSON, "stdout"); !strings.HasPrefix(got, "Linux version") {
		t.Errorf("stdout %q", got)
	}
	vmm, _ := r.JSON["vmm"].(map[string]any)
	if v, _ := vmm["version"].(string); !strings.HasPrefix(v, "10.") || vmm["path"] != bin {
		t.Errorf("report's vmm %v; want QEMU 10 at %s", vmm, bin)
	}
	if w, _ := r.JSON["warnings"].([]any); slices.Contains(w, any(sandbox.UnconfinedWarning)) {
		t.Errorf("the run was not jailed: warnings %v", w)
	}
	console, err := os.ReadFile(e2e.Str(r.JSON, "serial_log_path"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(console), "SeaBIOS") || !strings.Contains(string(console), "isopod-agent: ready") {
		t.Errorf("the console shows no SeaBIOS boot: %.600q", console)
	}
	t.Logf("QEMU %s: cold run %v ms, boot %v ms", vmm["version"], r.JSON["total_ms"], r.JSON["boot_ms"])

	d := e2e.Isopod(t, env, "doctor")
	checks, _ := d.JSON["checks"].([]any)
	var qemu map[string]any
	for _, c := range checks {
		if m, _ := c.(map[string]any); m["name"] == "qemu" {
			qemu = m
		}
	}
	detail, _ := qemu["detail"].(map[string]any)
	why, _ := qemu["why"].(string)
	if qemu["ok"] != true || detail["firmware_kind"] != "SeaBIOS" || strings.Contains(why, "x-option-roms=off") ||
		!strings.Contains(why, "QEMU 10.") || !strings.Contains(why, "option ROMs stay on") || !strings.Contains(why, "bzImage") {
		t.Errorf("doctor's qemu check on QEMU 10: %v", qemu)
	}
}

// TestWarmRunQEMU10: the warm pool works on QEMU 10.0. The first run of a
// shape builds its snapshot inside the run; the snapshot VM holds every
// disk slot, more virtio devices than a direct (PVH) boot of the
// uncompressed kernel survives under SeaBIOS, so it boots the bzImage.
// The run goes on in the snapshot's VM; the next run of the shape
// resumes from that snapshot.
func TestWarmRunQEMU10(t *testing.T) {
	e2e.RequireVM(t)
	bin := vmmtest.QEMU10(t)
	env := []string{"ISOPOD_QEMU=" + bin}
	args := []string{"run", "--no-network", "--mem-mib", "352", "--", "cat", "/proc/version"}
	first := e2e.Isopod(t, env, args...)
	if first.Code != 0 || first.JSON["snapshot_built"] != true || !strings.HasPrefix(e2e.Str(first.JSON, "stdout"), "Linux version") {
		t.Fatalf("the first run on QEMU 10 built no snapshot:\n%s", first)
	}
	second := e2e.Isopod(t, env, args...)
	if second.Code != 0 || second.JSON["path"] != "warm" || second.JSON["snapshot_built"] == true {
		t.Fatalf("the second run on QEMU 10 did not resume warm:\n%s", second)
	}
	if got := e2e.Str(second.JSON, "stdout"); !strings.HasPrefix(got, "Linux version") {
		t.Errorf("stdout %q", got)
	}
	t.Logf("QEMU 10: build and run %v ms, warm run %v ms (resume %v ms)",
		first.JSON["total_ms"], second.JSON["total_ms"], second.JSON["resume_ms"])
}
