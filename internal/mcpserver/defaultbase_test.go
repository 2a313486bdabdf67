package mcpserver

import (
	"context"
	"slices"
	"strings"
	"testing"

	"isopod/internal/image"
)

// TestFirstCallOnDefaultInstall: on a host with base-min only (what the
// default install builds), the first call a model makes, with no base and
// no stage, runs on base-min and says how to build the default base; a
// call that names base-debian is refused with that command.
func TestFirstCallOnDefaultInstall(t *testing.T) {
	core, _ := newFakeCoreOver(t, image.FlavorBaseMin)
	s := connect(t, Config{Core: core, NoStartupGC: true})
	ctx := context.Background()
	hint := "isopod image build " + DefaultBase

	rep := reportOf(t, s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "echo hi", "cwd": "/"}, nil))
	if rep.ExitCode == nil || *rep.ExitCode != 0 || rep.Stdout != "hi\n" || rep.RootfsFlavor != image.FlavorBaseMin {
		t.Errorf("exit %v, stdout %q, rootfs %s; want 0, hi, base-min", rep.ExitCode, rep.Stdout, rep.RootfsFlavor)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, hint) }) {
		t.Errorf("warnings %q lack %q", rep.Warnings, hint)
	}

	res := s.call(t, ctx, ToolSandboxRun, map[string]any{"cmd": "echo hi", "cwd": "/", "base": DefaultBase}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, "failed_precondition") || !strings.Contains(text, hint) {
		t.Errorf("base %s named but not built: %s", DefaultBase, text)
	}
}
