package layering

import (
	"go/build"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const mod = "isopod/"

// pkg is what the rules need to know of one package.
type pkg struct {
	ImportPath string
	Imports    []string
	// Files maps each of its (non-test) files to what that file imports.
	Files map[string][]string
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
		files, err := fileImports(path, bp.GoFiles)
		if err != nil {
			return err
		}
		pkgs[ip] = pkg{ImportPath: ip, Imports: bp.Imports, Files: files}
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

// fileImports parses the import clause of each of files in dir.
func fileImports(dir string, files []string) (map[string][]string, error) {
	out := map[string][]string{}
	fset := token.NewFileSet()
	for _, name := range files {
		f, err := parser.ParseFile(fset, filepath.Join(dir, name), nil, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		for _, is := range f.Imports {
			imp, err := strconv.Unquote(is.Path.Value)
			if err != nil {
				return nil, err
			}
			out[name] = append(out[name], imp)
		}
	}
	return out, nil
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
		{"the jail helper's inside imports only the standard library and x/sys, so that isopod-jail stays small",
			under("internal/jail/jailchild"),
			func(_, imp string) bool { return isStd(imp) || strings.HasPrefix(imp, "golang.org/x/sys/") }},
		{"vmm and its drivers never import the core, the machine layer or the front ends",
			under("internal/vmm"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !frontEnd(imp)
			}},
		{"the egress policy imports no host networking",
			func(p string) bool { return p == mod+"internal/egress" },
			func(_, imp string) bool {
				return !under("internal/netstack")(imp) && !strings.HasPrefix(imp, "gvisor.dev/") &&
					!under("internal/egress/proxy")(imp) && imp != "net/http"
			}},
		{"only the front ends (and end-to-end test helpers) read settings (config)",
			func(p string) bool { return !frontEnd(p) && !strings.HasPrefix(p, mod+"integration/") },
			func(_, imp string) bool { return imp != mod+"internal/config" }},
		{"only the wiring point (sandbox, in its wiring.go: TestDriverWiring) and the benchmarks name a VMM driver",
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
		{"admission imports neither the core, nor a front end, nor config",
			under("internal/admission"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !frontEnd(imp) && imp != mod+"internal/config"
			}},
		{"the ledger imports only the standard library and flock",
			under("internal/ledger"),
			func(_, imp string) bool { return isStd(imp) || imp == "github.com/gofrs/flock" }},
		{"the machine layer imports neither the core, nor a front end, nor config, nor a VMM driver (it takes a vmm.Driver)",
			under("internal/machine"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !frontEnd(imp) && imp != mod+"internal/config" && !driver(imp)
			}},
		{"a session's record imports neither the core, the machine layer, a front end, config, nor a VMM",
			func(pkg string) bool { return pkg == mod+"internal/session" },
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !frontEnd(imp) &&
					imp != mod+"internal/config" && !under("internal/vmm")(imp)
			}},
		{"a paused VM's files import neither the core, the machine layer, a session, a front end, config, nor a VMM driver",
			under("internal/pausefile"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !under("internal/session")(imp) &&
					!frontEnd(imp) && imp != mod+"internal/config" && !driver(imp)
			}},
		{"a session's supervisor imports no front end, nor config, nor a VMM driver: it gets its VM from the core",
			under("internal/session/supervisor"),
			func(_, imp string) bool { return !frontEnd(imp) && imp != mod+"internal/config" && !driver(imp) }},
		{"a VM's network imports neither the core, the machine layer, a front end, config, nor a VMM driver",
			under("internal/vmnet"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !frontEnd(imp) &&
					imp != mod+"internal/config" && !driver(imp)
			}},
		{"credentials import neither the core, the machine layer, the network stack, a front end nor config",
			under("internal/credential"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !under("internal/netstack")(imp) &&
					!frontEnd(imp) && imp != mod+"internal/config"
			}},
		{"the stage store's housekeeping imports neither the core, nor a front end, nor config, nor the machine layer or a VMM",
			under("internal/stages"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !frontEnd(imp) && imp != mod+"internal/config" &&
					!under("internal/machine")(imp) && !under("internal/vmm")(imp)
			}},
		{"VM records import neither the core, nor a front end, nor config, nor a VMM driver",
			under("internal/vmrecord"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !frontEnd(imp) && imp != mod+"internal/config" && !driver(imp)
			}},
		{"a workspace's copy and patch import neither the core, the machine layer, a front end, config, nor a VMM",
			under("internal/workspace"),
			func(_, imp string) bool {
				return !under("internal/sandbox")(imp) && !under("internal/machine")(imp) && !frontEnd(imp) &&
					imp != mod+"internal/config" && !under("internal/vmm")(imp)
			}},
		{"the reports are plain data: they import only the standard library and vmm (its types)",
			under("internal/report"),
			func(_, imp string) bool { return isStd(imp) || imp == mod+"internal/vmm" }},
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

// wiringFile is the one file of the core that names VMM drivers: it picks
// the one ISOPOD_VMM selects, and the rest of the core speaks to it
// through the vmm contract.
const wiringFile = "wiring.go"

// strayDriverImports lists the files of p, other than its wiring file,
// that import a VMM driver, as "file imports driver".
func strayDriverImports(p pkg) []string {
	var stray []string
	for name, imps := range p.Files {
		for _, imp := range imps {
			if driver(imp) && name != wiringFile {
				stray = append(stray, name+" imports "+imp)
			}
		}
	}
	slices.Sort(stray)
	return stray
}

// TestDriverWiring: in the core, only its wiring file names a VMM driver.
func TestDriverWiring(t *testing.T) {
	core, ok := listPackages(t)[mod+"internal/sandbox"]
	if !ok {
		t.Fatal("no internal/sandbox")
	}
	if !slices.ContainsFunc(core.Files[wiringFile], driver) {
		t.Errorf("sandbox/%s imports no VMM driver: the core picks its driver there", wiringFile)
	}
	for _, s := range strayDriverImports(core) {
		t.Errorf("sandbox/%s: only sandbox/%s names a VMM driver; speak to it through the vmm contract (vmm.Driver, vmm.Prober, ...)", s, wiringFile)
	}
}

// TestStrayDriverImports: the wiring rule finds a core file that imports
// a driver, and lets the wiring file, the contract and the fake pass.
func TestStrayDriverImports(t *testing.T) {
	p := pkg{Files: map[string][]string{
		wiringFile:  {"fmt", mod + "internal/vmm", mod + "internal/vmm/qemu"},
		"doctor.go": {"context", mod + "internal/vmm/qemu"},
		"run.go":    {mod + "internal/vmm", mod + "internal/vmm/vmmfake", mod + "internal/vmm/vmmtest"},
		"vm.go":     {mod + "internal/vmm/firecracker"},
	}}
	want := []string{"doctor.go imports " + mod + "internal/vmm/qemu", "vm.go imports " + mod + "internal/vmm/firecracker"}
	if got := strayDriverImports(p); !slices.Equal(got, want) {
		t.Errorf("stray imports %q; want %q", got, want)
	}
}
