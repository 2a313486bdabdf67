package mcpserver

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"isopod/integration/e2e"
	"isopod/internal/image"
	"isopod/internal/knobs"
	"isopod/internal/paths"
	"isopod/internal/sandbox/sandboxtest"
)

// TestVMAllowCIDRsEmptyIsFiltered: allow_cidrs: [] alone, through the real
// server, boots a filtered run that denies everything and records it, not
// a NAT one.
func TestVMAllowCIDRsEmptyIsFiltered(t *testing.T) {
	base := vmBase(t)
	s := startStdio(t, t.TempDir(), nil)
	// busybox wget (base-min) and curl (base-debian) both use the gateway
	// proxy the filtered run sets; either attempt is denied.
	cmd := "wget -q -T 10 -O /dev/null http://192.0.2.10/ || curl -s -m 10 -o /dev/null http://192.0.2.10/; true"
	rep := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": cmd, "base": base, "allow_cidrs": []string{},
	}, nil))
	if rep.Net == nil || rep.Net.Mode != "filtered" {
		t.Fatalf("net %+v; want a filtered run", rep.Net)
	}
	var eg struct {
		Mode   string            `json:"mode"`
		Denied []json.RawMessage `json:"denied"`
	}
	raw, _ := json.Marshal(rep.Egress)
	if err := json.Unmarshal(raw, &eg); err != nil || len(eg.Denied) == 0 {
		t.Errorf("egress %s (%v); want the attempt denied and recorded", raw, err)
	}
}

// TestVMFirstCallOnDefaultInstall: with base-min the only base built (a
// default install), the first call of the specification,
// sandbox_run(cmd="echo hi"), runs on base-min and warns how to build the
// default base.
func TestVMFirstCallOnDefaultInstall(t *testing.T) {
	vmBase(t)
	src := os.Getenv(knobs.Home)
	p, err := paths.New(src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := image.LookupBase(p, image.FlavorBaseMin); err != nil {
		t.Skipf("base-min is not usable under %s: %v", src, err)
	}
	h, err := e2e.NewHome("", src)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Close(); err != nil {
			t.Error(err)
		}
	})
	hp, err := paths.New(h.Dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{image.BasePath(hp, DefaultBase), sandboxtest.Sidecar(image.BasePath(hp, DefaultBase))} {
		if err := os.Remove(f); err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
	}
	s := startStdio(t, t.TempDir(), map[string]string{knobs.Home: h.Dir})
	rep := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "echo hi"}, nil))
	if rep.ExitCode == nil || *rep.ExitCode != 0 || rep.Stdout != "hi\n" || rep.RootfsFlavor != image.FlavorBaseMin {
		t.Errorf("exit %v, stdout %q, rootfs %s; want 0, hi, base-min", rep.ExitCode, rep.Stdout, rep.RootfsFlavor)
	}
	hint := "isopod image build " + DefaultBase
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, hint) }) {
		t.Errorf("warnings %q lack %q", rep.Warnings, hint)
	}
}
