package mcpserver

import (
	"context"
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
	"isopod/internal/vmrecord"
)

// jsonNames lists the JSON member names of struct type t, embedded structs
// flattened.
func jsonNames(t reflect.Type) []string {
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		tag, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && tag == "" {
			names = append(names, jsonNames(f.Type)...)
			continue
		}
		if tag == "-" || !f.IsExported() {
			continue
		}
		if tag == "" {
			tag = f.Name
		}
		names = append(names, tag)
	}
	slices.Sort(names)
	return names
}

// TestRunResultCoversTheReport: the MCP result carries every field of the
// core's report under the same name, except the three the MCP contract
// names differently, plus the two the server adds. A field the core adds
// fails this until it is projected.
func TestRunResultCoversTheReport(t *testing.T) {
	renamed := map[string]string{"name": "vm_name", "exec_ms": "duration_ms", "ok": ""}
	var want []string
	for _, n := range jsonNames(reflect.TypeFor[report.Run]()) {
		if to, ok := renamed[n]; ok {
			if to != "" {
				want = append(want, to)
			}
			continue
		}
		want = append(want, n)
	}
	// The server's own: read_files and the stage registry.
	want = append(want, "files", "registry")
	slices.Sort(want)
	if got := jsonNames(reflect.TypeFor[RunResult]()); !slices.Equal(got, want) {
		t.Errorf("RunResult fields\n got %v\nwant %v", got, want)
	}
}

func TestRunResultNames(t *testing.T) {
	code, boot := 0, int64(7)
	core := &scriptedCore{run: func(context.Context, sandbox.Request) (*report.Run, error) {
		return &report.Run{OK: true, VMID: "vm-1", Name: "quiet-otter", Argv: []string{"/bin/sh", "-c", "true"},
			Outcome: report.Outcome{ExitCode: &code}, ExecMS: 42, BootMS: &boot, TotalMS: 99, Path: "cold",
			Warnings: []string{"nothing committed: --commit-as commits only when the command exits 0"}}, nil
	}}
	s := connect(t, Config{Core: core, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true"}, nil)
	if res.IsError {
		t.Fatal(resultText(res))
	}
	raw, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]any{"vm_id": "vm-1", "vm_name": "quiet-otter", "duration_ms": float64(42), "boot_ms": float64(7), "total_ms": float64(99)} {
		if m[k] != v {
			t.Errorf("%s = %v; want %v (result %s)", k, m[k], v, raw)
		}
	}
	for _, k := range []string{"ok", "name", "exec_ms"} {
		if _, ok := m[k]; ok {
			t.Errorf("the MCP result carries %q: %s", k, raw)
		}
	}
	if argv, _ := m["argv"].([]any); len(argv) != 3 {
		t.Errorf("argv = %v", m["argv"])
	}
	if w, _ := m["warnings"].([]any); len(w) != 1 || !strings.Contains(w[0].(string), "commit_as commits only") {
		t.Errorf("warnings are not in the server's words: %v", m["warnings"])
	}
	var fromText map[string]any
	if err := json.Unmarshal([]byte(resultText(res)), &fromText); err != nil || !reflect.DeepEqual(fromText, m) {
		t.Errorf("the text block is not the structured result: %v\n%s", err, resultText(res))
	}
}

// TestListResultsHaveNoOK: list results are projections too, with
// created_unix beside created.
func TestListResultsHaveNoOK(t *testing.T) {
	r := vmListResult(&vmrecord.VMListResult{OK: true, VMs: []vmrecord.VMEntry{{ID: "vm-1", Created: "2026-12-01T10:00:00Z", Live: false}}})
	b, _ := json.Marshal(r)
	var m map[string]any
	json.Unmarshal(b, &m)
	if _, ok := m["ok"]; ok {
		t.Errorf("vm_list result has ok: %s", b)
	}
	vm := m["vms"].([]any)[0].(map[string]any)
	if vm["created_unix"] != float64(1796119200) || vm["created"] != "2026-12-01T10:00:00Z" || vm["live"] != false {
		t.Errorf("vm entry %s", b)
	}
	st := stageListResult(&stages.StageListResult{OK: true, Stages: []stages.StageEntry{{ID: "st-1", Created: "2026-12-01T10:00:00Z"}}})
	b, _ = json.Marshal(st)
	if !strings.Contains(string(b), `"created_unix":1796119200`) || strings.Contains(string(b), `"ok"`) {
		t.Errorf("stage_list result %s", b)
	}
}
