package sandbox_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
	"isopod/internal/workspace"
)

// TestWorkspaceOutUnmade: a patch the guest cannot list (the fake guest
// has no workspace layers) is reported in the workspace block and a
// warning naming the destination; the run's result stands and the
// destination is left as it was, with no staging file beside it.
func TestWorkspaceOutUnmade(t *testing.T) {
	s, _ := newColdService(t, vmmfake.Config{})
	tree := t.TempDir()
	if err := os.WriteFile(filepath.Join(tree, "a.txt"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	outDir := t.TempDir()
	out := filepath.Join(outDir, "ws.patch")
	os.WriteFile(out, []byte("old patch"), 0o644)
	rep := run(t, s, sandbox.Request{NoNetwork: true, Argv: []string{"true"},
		Workspace: &workspace.Request{Host: tree, Guest: "/src", Out: out}})
	if code(rep) != 0 {
		t.Fatalf("exit %d; want the command's 0", code(rep))
	}
	w := rep.Workspace
	if w == nil || w.PatchError == "" || !strings.Contains(w.PatchError, "no workspace") || w.OutMS == nil || w.Changed != nil || w.PatchBytes != nil {
		t.Fatalf("workspace block %+v; want a patch_error, out_ms, no counts", w)
	}
	if !strings.Contains(strings.Join(rep.Warnings, "\n"), "no workspace patch was written to "+out+": "+w.PatchError) {
		t.Errorf("warnings %q lack the unwritten patch", rep.Warnings)
	}
	if b, _ := os.ReadFile(out); string(b) != "old patch" {
		t.Errorf("destination changed to %q", b)
	}
	if ents, _ := os.ReadDir(outDir); len(ents) != 1 {
		t.Errorf("%d entries beside the patch; want none", len(ents)-1)
	}
}
