package main

import (
	"os/exec"
	"strings"
	"testing"
)

// allowedDeps are the only non-standard packages the agent may link.
var allowedDeps = []string{
	"isopod/internal/agent",
	"isopod/internal/agentproto",
	"isopod/internal/errdefs",
	"golang.org/x/sys/",
	"isopod/cmd/isopod-agent",
}

func allowed(pkg string) bool {
	for _, a := range allowedDeps {
		if pkg == a || (strings.HasSuffix(a, "/") && strings.HasPrefix(pkg, a)) ||
			strings.HasPrefix(pkg, a+"/") {
			return true
		}
	}
	return false
}

// TestDependencies keeps the agent small and static: besides the standard
// library it may import only golang.org/x/sys, agentproto, errdefs and its
// own packages.
func TestDependencies(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("the go command is not on PATH; cannot list dependencies")
	}
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	var seen int
	for _, pkg := range strings.Fields(string(out)) {
		seen++
		if !allowed(pkg) {
			t.Errorf("isopod-agent depends on %s; the agent may import only the standard library, golang.org/x/sys, isopod/internal/agentproto, isopod/internal/errdefs and isopod/internal/agent", pkg)
		}
	}
	if seen == 0 {
		t.Fatal("go list reported no non-standard packages; expected at least isopod/internal/agent")
	}
}
