package contract

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
)

// probe makes a filtered run record events: a name to resolve and an
// address to reach, both refused.
const probe = "wget -q -T 3 -O /dev/null http://example.com/; wget -q -T 3 -O /dev/null http://192.0.2.1/; echo probed"

// scenario is one kind of run, as each front end asks for it.
type scenario struct {
	name string
	// holds are the conditions the run sets up (cold and warm are read
	// from the report).
	holds []string
	// path is the boot path the run must take, "" for either; noWarm
	// runs it with the warm pool off (a cold run of any shape).
	path   string
	noWarm bool
	// setup, if set, runs before the run.
	setup func(t *testing.T)
	cli   func(t *testing.T) []string
	mcp   func(t *testing.T) map[string]any
}

// scenarios are the runs the contract is checked on; front tells the
// front ends' stages apart.
func scenarios(front string) []scenario {
	label := fmt.Sprintf("contract/%s-%d-%d", front, os.Getpid(), time.Now().UnixNano()%1e9)
	marker := "echo " + label + " > /root/contract-marker"
	return []scenario{
		{name: "cold", path: "cold", noWarm: true,
			cli: func(*testing.T) []string { return []string{"--no-network", "--", "echo", "hi"} },
			mcp: func(*testing.T) map[string]any {
				return map[string]any{"cmd": "echo hi", "base": "base-min", "network": false}
			}},
		{name: "warm", holds: []string{"networked"}, path: "warm", setup: prebuildWarm,
			cli: func(*testing.T) []string { return []string{"--", "echo", "hi"} },
			mcp: func(*testing.T) map[string]any { return map[string]any{"cmd": "echo hi", "base": "base-min"} }},
		{name: "filtered", holds: []string{"networked", "filtered"},
			cli: func(*testing.T) []string { return []string{"--deny-egress", "--", "sh", "-c", probe} },
			mcp: func(*testing.T) map[string]any {
				return map[string]any{"cmd": probe, "base": "base-min", "allow_hosts": []string{}}
			}},
		{name: "commit", holds: []string{"commit"},
			cli: func(*testing.T) []string {
				return []string{"--no-network", "--commit-as", label, "--", "sh", "-c", marker}
			},
			mcp: func(*testing.T) map[string]any {
				return map[string]any{"cmd": marker, "base": "base-min", "network": false, "commit_as": label}
			}},
		{name: "copy-out", holds: []string{"copy_out"},
			cli: func(t *testing.T) []string {
				return []string{"--no-network", "--copy-out", "/root/out.txt:" + filepath.Join(t.TempDir(), "out.txt"),
					"--", "sh", "-c", "echo artefact > /root/out.txt"}
			},
			mcp: func(*testing.T) map[string]any {
				return map[string]any{"cmd": "echo artefact > /root/out.txt", "base": "base-min", "network": false,
					"copy_out": []map[string]string{{"guest": "/root/out.txt", "host": "out/out.txt"}}}
			}},
		{name: "workspace", holds: []string{"workspace"},
			cli: func(t *testing.T) []string {
				dir := t.TempDir()
				ws := filepath.Join(dir, "ws")
				if err := os.Mkdir(ws, 0o755); err != nil {
					t.Fatal(err)
				}
				return []string{"--no-network", "--workspace", ws, "--workspace-out", filepath.Join(dir, "ws.patch"),
					"--", "sh", "-c", "echo new > new.txt"}
			},
			mcp: func(*testing.T) map[string]any {
				return map[string]any{"cmd": "echo new > new.txt", "base": "base-min", "network": false,
					"workspace": "ws", "workspace_out": "ws.patch"}
			}},
	}
}

// TestCLIReports holds `isopod run` reports to the CLI contract. The runs
// are made with ISOPOD_JAIL=off, which every report must say.
func TestCLIReports(t *testing.T) {
	e2e.RequireVM(t)
	c := loadContracts(t).CLI
	env := []string{knobs.Jail + "=off"}
	for _, sc := range scenarios("cli") {
		t.Run(sc.name, func(t *testing.T) {
			rep := runUntil(t, sc, func() map[string]any {
				env := env
				if sc.noWarm {
					env = append(env, knobs.WarmPool+"=off")
				}
				r := e2e.Isopod(t, env, append([]string{"run"}, sc.cli(t)...)...)
				if r.Code != 0 || r.JSON["ok"] != true {
					t.Fatalf("isopod run failed:\n%s", r)
				}
				return r.JSON
			})
			checkReport(t, "CLI "+sc.name, c, rep, sc.holds...)
			if !slices.Contains(asList(rep["warnings"]), any(sandbox.UnconfinedWarning)) {
				t.Errorf("warnings %v lack %q", rep["warnings"], sandbox.UnconfinedWarning)
			}
			if id, _ := rep["stage_id"].(string); id != "" {
				e2e.Isopod(t, nil, "stage", "rm", id)
			}
		})
	}
}

// TestMCPReports holds sandbox_run's structuredContent to the MCP
// contract, through a real isopod-mcp.
func TestMCPReports(t *testing.T) {
	e2e.RequireVM(t)
	c := loadContracts(t).MCP
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "ws"), 0o755); err != nil {
		t.Fatal(err)
	}
	warm := e2e.StartMCP(t, "isopod-contract", root, nil, knobs.Jail+"=off")
	outer := t
	var cold *mcp.ClientSession // a server without the warm pool, for noWarm runs
	for _, sc := range scenarios("mcp") {
		t.Run(sc.name, func(t *testing.T) {
			cs := warm
			if sc.noWarm {
				if cold == nil {
					cold = e2e.StartMCP(outer, "isopod-contract", root, nil, knobs.Jail+"=off", knobs.WarmPool+"=off")
				}
				cs = cold
			}
			rep := runUntil(t, sc, func() map[string]any {
				res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_run", Arguments: sc.mcp(t)})
				if err != nil {
					t.Fatalf("sandbox_run: %v", err)
				}
				if res.IsError {
					t.Fatalf("sandbox_run failed: %v", res.Content)
				}
				var m map[string]any
				b, _ := json.Marshal(res.StructuredContent)
				if err := json.Unmarshal(b, &m); err != nil || m == nil {
					t.Fatalf("structuredContent %s: %v", b, err)
				}
				return m
			})
			checkReport(t, "MCP "+sc.name, c, rep, sc.holds...)
			if !slices.Contains(asList(rep["warnings"]), any(sandbox.UnconfinedWarning)) {
				t.Errorf("warnings %v lack %q", rep["warnings"], sandbox.UnconfinedWarning)
			}
			if id, _ := rep["stage_id"].(string); id != "" {
				cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "stage_rm", Arguments: map[string]any{"reference": id}})
			}
		})
	}
}

// prebuildWarm builds the warm snapshot the warm runs resume from, so
// that the run checked is a plain resume. (A run that builds the snapshot
// first reports that build, snapshot_built, too.)
func prebuildWarm(t *testing.T) {
	t.Helper()
	if r := e2e.Isopod(t, nil, "warmpool", "build", "--base", "base-min"); r.Code != 0 {
		t.Fatalf("isopod warmpool build:\n%s", r)
	}
}

// runUntil runs sc, and once more if the path it must take was not
// taken (a warm run whose snapshot had to be built first); the report
// that took it is returned.
func runUntil(t *testing.T, sc scenario, run func() map[string]any) map[string]any {
	t.Helper()
	if sc.setup != nil {
		sc.setup(t)
	}
	rep := run()
	if sc.path != "" && rep["path"] != sc.path {
		t.Logf("%s: path %v on the first run; running again", sc.name, rep["path"])
		rep = run()
	}
	if sc.path != "" && rep["path"] != sc.path {
		t.Fatalf("%s: path %v; want %s", sc.name, rep["path"], sc.path)
	}
	return rep
}
