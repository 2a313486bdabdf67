package layering

import (
	"go/build"
	"io/fs"
	"path/filepath"
	"strings"
	"testing"
)

const mod = "isopod/"

// pkg is what the rules need to know of one package.
type pkg struct {
	ImportPath string
	Imports    []string
}

// listPackages parses every package of the module for its direct imports
// (tests excluded: the rules are about what ships). It reads the sources
// itself, so a change to any of them reruns the test.
func listPackages(t *testing.T) map[string]pkg {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string]pkg{}
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules" || name == "bin") {
			return filepath.SkipDir
		}
		bp, err := build.Default.ImportDir(path, 0)
		if err != nil {
			return nil // no Go files here
		}
		rel, _ := filepath.Rel(root, path)
		ip := mod + filepath.ToSlash(rel)
		pkgs[ip] = pkg{ImportPath: ip, Imports: bp.Imports}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found only %d packages under %s", len(pkgs), root)
	}
	return pkgs
}

func short(path string) string { return strings.TrimPrefix(path, mod+"internal/") }

// isStd reports whether an import path is the standard library's.
func isStd(path string) bool {
	first, _, _ := strings.Cut(path, "/")
	return !strings.Contains(first, ".") && !strings.HasPrefix(path, mod)
}

// TestImportRules checks the layering that docs/architecture.md states.
func TestImportRules(t *testing.T) {
	pkgs := listPackages(t)
	type rule struct {
		name string
		// applies selects the importing packages the rule is about.
		applies func(from string) bool
		// allowed says whether from may import imp.
		allowed func(from, imp string) bool
	}
	under := func(prefix string) func(string) bool {
		return func(p string) bool { return p == mod+prefix || strings.HasPrefix(p, mod+prefix+"/") }
	}
	rules := []rule{
		{"the protocol package imports only the standard library",
			under("internal/agentproto"),
			func(_, imp string) bool { return isStd(imp) }},
		{"the guest agent imports only the standard library, x/sys, agentproto and errdefs",
			under("internal/agent"),
			func(_, imp string) bool {
				return isStd(imp) || strings.HasPrefix(imp, "golang.org/x/sys/") ||
					imp == mod+"internal/agentproto" || imp == mod+"internal/errdefs" || under("internal/agent")(imp)
			}},
		{"vmm and its drivers never import the core or the front ends",
			under("internal/vmm"),
			func(_, imp string) bool { return !under("internal/sandbox")(imp) && !frontEnd(imp) }},
		{"the egress policy imports no host networking",
			func(p string) bool { return p == mod+"internal/egress" },
			func(_, imp string) bool {
				return !under("internal/netstack")(imp) && !strings.HasPrefix(imp, "gvisor.dev/") &&
					!under("internal/egress/proxy")(imp) && imp != "net/http"
			}},
		{"only the front ends (and end-to-end test helpers) read settings (config)",
			func(p string) bool { return !frontEnd(p) && !strings.HasPrefix(p, mod+"integration/") },
			func(_, imp string) bool { return imp != mod+"internal/config" }},
		{"only the wiring point (sandbox) and the benchmarks name a VMM driver",
			func(p string) bool { return p != mod+"internal/sandbox" && p != mod+"internal/bench" },
			func(_, imp string) bool { return !driver(imp) }},
		{"the settings value imports nothing that reads or runs: only paths, vmm (the contract) and oci's types",
			under("internal/settings"),
			func(_, imp string) bool {
				return isStd(imp) || imp == mod+"internal/paths" || imp == mod+"internal/vmm" || imp == mod+"internal/oci"
			}},
		{"host-I/O confinement imports neither the core, nor a front end, nor config",
			under("internal/hostio"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !frontEnd(imp) && imp != mod+"internal/config"
			}},
		{"the core imports no front end",
			under("internal/sandbox"),
			func(_, imp string) bool { return !frontEnd(imp) && imp != mod+"internal/config" }},
	}
	for _, r := range rules {
		checked := 0
		for _, p := range pkgs {
			if !strings.HasPrefix(p.ImportPath, mod) || !r.applies(p.ImportPath) {
				continue
			}
			checked++
			for _, imp := range p.Imports {
				if !r.allowed(p.ImportPath, imp) {
					t.Errorf("%s imports %s: %s", short(p.ImportPath), imp, r.name)
				}
			}
		}
		if checked == 0 {
			t.Errorf("rule %q applies to no package", r.name)
		}
	}
}

// frontEnd reports whether p is a front end (or a main package).
func frontEnd(p string) bool {
	return p == mod+"internal/cli" || p == mod+"internal/mcpserver" || strings.HasPrefix(p, mod+"cmd/")
}

// driver reports whether p is a VMM driver package (internal/vmm/<name>,
// other than the test suite and the in-memory fake).
func driver(p string) bool {
	name, ok := strings.CutPrefix(p, mod+"internal/vmm/")
	return ok && !strings.Contains(name, "/") && name != "vmmtest" && !strings.HasPrefix(name, "vmmfake")
}
