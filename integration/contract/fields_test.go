package contract

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"
)

// fieldList is one object's contract in docs/contract/report-fields.json.
type fieldList struct {
	// Always must be present.
	Always []string `json:"always"`
	// When maps a field to the condition under which it is present; it is
	// absent otherwise.
	When map[string]string `json:"when"`
	// Optional may or may not be present.
	Optional []string `json:"optional"`
	// Absent must never be present, with why.
	Absent map[string]string `json:"absent"`
}

// contract is one front end's report contract.
type contract struct {
	Source      string    `json:"source"`
	Report      fieldList `json:"report"`
	Egress      fieldList `json:"egress"`
	EgressEvent fieldList `json:"egress_event"`
	CopiedFile  fieldList `json:"copied_file"`
}

type contracts struct {
	MCP contract `json:"mcp"`
	CLI contract `json:"cli"`
}

// loadContracts reads the field lists kept in the repository.
func loadContracts(t testing.TB) contracts {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "contract", "report-fields.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c contracts
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("docs/contract/report-fields.json: %v", err)
	}
	for name, fc := range map[string]contract{"mcp": c.MCP, "cli": c.CLI} {
		if fc.Source == "" || len(fc.Report.Always) < 10 || len(fc.Egress.Always) == 0 || len(fc.EgressEvent.Always) == 0 || len(fc.CopiedFile.Always) == 0 {
			t.Fatalf("docs/contract/report-fields.json: the %s contract is incomplete", name)
		}
	}
	return c
}

// violations lists how obj breaks fl, given the conditions that hold. Each
// names the field.
func violations(fl fieldList, obj map[string]any, holds map[string]bool) []string {
	var bad []string
	for _, f := range fl.Always {
		if _, ok := obj[f]; !ok {
			bad = append(bad, f+": missing")
		}
	}
	for f, cond := range fl.When {
		_, ok := obj[f]
		switch {
		case holds[cond] && !ok:
			bad = append(bad, f+": missing ("+cond+")")
		case !holds[cond] && ok:
			bad = append(bad, f+": present, but only "+cond+" reports carry it")
		}
	}
	for f, why := range fl.Absent {
		if _, ok := obj[f]; ok {
			bad = append(bad, f+": present ("+why+")")
		}
	}
	sort.Strings(bad)
	return bad
}

// checkReport holds a report (decoded JSON) to c. holds are the
// conditions the run set up; cold, warm and snapshot_built are read from
// the report itself.
func checkReport(t *testing.T, front string, c contract, rep map[string]any, holds ...string) {
	t.Helper()
	h := map[string]bool{}
	for _, x := range holds {
		h[x] = true
	}
	path, _ := rep["path"].(string)
	h[path] = true
	h["snapshot_built"] = rep["snapshot_built"] == true
	for _, v := range violations(c.Report, rep, h) {
		t.Errorf("%s report: %s\n  (contract: %s)", front, v, c.Source)
	}
	if eg, ok := rep["egress"].(map[string]any); ok {
		checkEgress(t, front, c, eg)
	} else if h["filtered"] {
		t.Errorf("%s report: egress is not an object: %v", front, rep["egress"])
	}
	if copied, ok := rep["copied"]; ok {
		items, _ := copied.([]any)
		if len(items) == 0 {
			t.Errorf("%s report: copied is %v; want one entry per copied file", front, copied)
		}
		for i, it := range items {
			m, _ := it.(map[string]any)
			for _, v := range violations(c.CopiedFile, m, h) {
				t.Errorf("%s report: copied[%d].%s", front, i, v)
			}
		}
	}
	if t.Failed() {
		b, _ := json.Marshal(rep)
		t.Logf("%s report: %s", front, b)
	}
}

// checkEgress holds an egress block and its events to c.
func checkEgress(t *testing.T, front string, c contract, eg map[string]any) {
	t.Helper()
	for _, v := range violations(c.Egress, eg, nil) {
		t.Errorf("%s report: egress.%s", front, v)
	}
	for _, list := range []string{"allowed_rules", "allowed", "denied", "dns_queries"} {
		if _, ok := eg[list].([]any); !ok {
			t.Errorf("%s report: egress.%s is %v; want a list", front, list, eg[list])
		}
	}
	for _, q := range asList(eg["dns_queries"]) {
		if _, ok := q.(string); !ok {
			t.Errorf("%s report: egress.dns_queries holds %v; want the queried names", front, q)
		}
	}
	events := append(asList(eg["allowed"]), asList(eg["denied"])...)
	if len(events) == 0 {
		t.Errorf("%s report: the filtered run recorded no event, so EgressEvent cannot be checked: %v", front, eg)
	}
	for i, ev := range events {
		m, _ := ev.(map[string]any)
		for _, v := range violations(c.EgressEvent, m, nil) {
			t.Errorf("%s report: egress event %d: %s", front, i, v)
		}
	}
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// TestFieldListsAreConsistent: the two contracts agree where the front
// ends share a field, and the renames are each other's mirror.
func TestFieldListsAreConsistent(t *testing.T) {
	c := loadContracts(t)
	rename := map[string]string{"name": "vm_name", "exec_ms": "duration_ms"}
	for _, f := range c.CLI.Report.Always {
		want := f
		if to, ok := rename[f]; ok {
			want = to
		}
		if f != "ok" && !slices.Contains(c.MCP.Report.Always, want) {
			t.Errorf("the CLI report always has %s; the MCP result's list lacks %s", f, want)
		}
	}
	for from, to := range rename {
		if _, ok := c.MCP.Report.Absent[from]; !ok {
			t.Errorf("the MCP contract does not forbid the CLI's %s (it is %s there)", from, to)
		}
		if _, ok := c.CLI.Report.Absent[to]; !ok {
			t.Errorf("the CLI contract does not forbid the MCP's %s", to)
		}
	}
	for _, gone := range []string{"slot"} {
		if c.MCP.Report.Absent[gone] == "" || c.CLI.Report.Absent[gone] == "" {
			t.Errorf("%s must be listed as intentionally absent in both contracts", gone)
		}
	}
	if c.CLI.Report.Absent["fc_binary"] == "" {
		t.Error("fc_binary must be listed as intentionally absent from the CLI report")
	}
	// violations must be able to fail.
	if v := violations(c.MCP.Report, map[string]any{"name": "x"}, map[string]bool{"cold": true}); len(v) < len(c.MCP.Report.Always) {
		t.Errorf("an empty report broke only %d rules", len(v))
	}
}
