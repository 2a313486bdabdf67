package mcpserver

import (
	"bytes"
	"context"
	"flag"
	"strings"
	"testing"

	"isopod/internal/knobs"
)

// TestHelpListsEveryFlag: --help and -h print, on stdout, every flag with
// what it does, and the environment the server reads, and exit 0.
func TestHelpListsEveryFlag(t *testing.T) {
	for _, arg := range []string{"--help", "-h"} {
		var stdout, stderr bytes.Buffer
		code := mainWith(context.Background(), []string{arg}, strings.NewReader(""), &stdout, &stderr,
			func(string) (string, bool) { return "", false }, "test", nil)
		out := stdout.String()
		if code != 0 || stderr.Len() > 0 {
			t.Errorf("%s: exit %d, stderr %q", arg, code, stderr.String())
		}
		fs := flag.NewFlagSet("flags", flag.ContinueOnError)
		new(Flags).register(fs)
		n := 0
		fs.VisitAll(func(f *flag.Flag) {
			n++
			_, text := flag.UnquoteUsage(f)
			if !strings.Contains(out, "--"+f.Name) || !strings.Contains(out, text) {
				t.Errorf("%s: flag --%s or its description %q is missing", arg, f.Name, text)
			}
		})
		if n < 12 {
			t.Errorf("only %d flags registered", n)
		}
		for _, env := range []string{knobs.Home, knobs.LogLevel, knobs.MCPHostIORoot, knobs.MCPStdinFile, knobs.MCPCopyOut,
			knobs.MCPWorkspace, knobs.ReadyVMs, knobs.Jail, knobs.AllowBaseSkew, knobs.WarmPool, knobs.MaxVMs, knobs.MemoryBudgetMiB} {
			if !strings.Contains(out, env) {
				t.Errorf("%s: the environment variable %s is missing", arg, env)
			}
		}
		if !strings.Contains(out, "stands in for "+knobs.MCPHostIORoot) {
			t.Errorf("%s: --host-io-root does not name the variable it stands in for", arg)
		}
	}
}
