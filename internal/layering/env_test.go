package layering

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// envReaders are the packages below the front ends that may read the
// environment themselves, and why: each reads a variable of its own, never
// a setting (settings are read once, by internal/config).
var envReaders = map[string]string{
	"internal/config":         "reads the settings, for the front ends",
	"internal/agent":          "the guest agent's debug switch (agentproto.AgentDebugEnv)",
	"internal/jail":           "the jail's re-executed child finds its instructions",
	"internal/jail/jailchild": "the jail helper finds its instructions",
	"internal/testnet":        "a test network's re-executed child finds its role",
	"internal/hosttool":       "PATH, to find host tools",
	"internal/vmm/vmmtest":    "the driver test suite's kernel, for tests",
}

// TestEnvironmentReads checks that only the front ends and the packages
// in envReaders call os.Getenv or os.LookupEnv, and that none names an
// ISOPOD_ variable by a string literal: each is a constant in
// internal/knobs (or, for the guest agent, internal/agentproto).
func TestEnvironmentReads(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	err = filepath.WalkDir(filepath.Join(root, "internal"), func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if d.Name() == "testdata" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		rel, _ := filepath.Rel(root, filepath.Dir(path))
		pkg := mod + filepath.ToSlash(rel)
		for _, c := range envCalls(t, path) {
			seen++
			_, allowed := envReaders[filepath.ToSlash(rel)]
			if !allowed && !frontEnd(pkg) {
				t.Errorf("%s: %s reads the environment; settings are read once by internal/config at the front ends", c.pos, short(pkg))
			}
			if strings.HasPrefix(c.literal, "ISOPOD_") {
				t.Errorf("%s: %s names %s by a string literal; use its constant in internal/knobs or internal/agentproto", c.pos, short(pkg), c.literal)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if seen == 0 {
		t.Fatal("found no environment read at all; the test is looking in the wrong place")
	}
}

// envCall is one os.Getenv or os.LookupEnv call.
type envCall struct {
	pos     token.Position
	literal string // the variable's name when given as a string literal
}

// envCalls finds the environment reads in one file.
func envCalls(t *testing.T, path string) []envCall {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var calls []envCall
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) != 1 {
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || (sel.Sel.Name != "Getenv" && sel.Sel.Name != "LookupEnv") {
			return true
		}
		if id, ok := sel.X.(*ast.Ident); !ok || id.Name != "os" {
			return true
		}
		c := envCall{pos: fset.Position(call.Pos())}
		if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
			c.literal, _ = strconv.Unquote(lit.Value)
		}
		calls = append(calls, c)
		return true
	})
	return calls
}
