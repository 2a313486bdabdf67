package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"isopod/internal/ledger"
	"isopod/internal/paths"
	"isopod/internal/session"
)

// session ls gives each session the memory its running VM holds (the
// ledger's count), the disk its directory takes, its age and idle time,
// and their totals.
func TestSessionLsHolds(t *testing.T) {
	home := t.TempDir()
	t.Setenv("ISOPOD_HOME", home)
	p, _ := paths.New(home)
	st := session.Store{Paths: p}
	running, err := st.Create("up", session.Spec{MemMiB: 256}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	running.State, running.SupervisorPID = session.StateRunning, os.Getpid()
	running.Created, running.LastUsed = time.Now().Add(-time.Hour), time.Now().Add(-time.Minute)
	running.SupervisorStart = ledger.ProcStart(os.Getpid())
	if err := st.Write(running); err != nil {
		t.Fatal(err)
	}
	stopped, err := st.Create("down", session.Spec{}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	stopped.State = session.StateStopped
	if err := st.Write(stopped); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(st.SessionDir(stopped.ID), "disk.img"), make([]byte, 1<<20), 0o600); err != nil {
		t.Fatal(err)
	}
	h := ledger.Self("session")
	l, err := ledger.Open(p.Ledger(), h)
	if err != nil {
		t.Fatal(err)
	}
	tx, err := l.Begin()
	if err != nil {
		t.Fatal(err)
	}
	tx.Commit([]ledger.Item{{Kind: ledger.KindSession, CostMiB: 256 + 768, ID: running.ID}}, 0)
	t.Cleanup(func() { l.Clear() })

	code, m, _ := runCLIHome(t, "session", "ls")
	if code != 0 {
		t.Fatalf("session ls: %d %v", code, m)
	}
	byName := map[string]map[string]any{}
	for _, s := range m["sessions"].([]any) {
		row := s.(map[string]any)
		byName[row["name"].(string)] = row
	}
	if got := byName["up"]["memory_mib"]; got != float64(1024) {
		t.Errorf("a running session holds %v MiB; want 1024 (256 + the VMM's 768)", got)
	}
	if age, idle := byName["up"]["age_s"].(float64), byName["up"]["idle_s"].(float64); age < 3600 || age > 3700 || idle < 60 || idle > 160 {
		t.Errorf("age_s %v, idle_s %v; want about 3600 and 60", age, idle)
	}
	if got := byName["down"]["memory_mib"]; got != float64(0) {
		t.Errorf("a stopped session holds %v MiB; want 0", got)
	}
	if got, _ := byName["down"]["disk_bytes"].(float64); got < 1<<20 {
		t.Errorf("a session with a 1 MiB file takes %v bytes", got)
	}
	total := m["total"].(map[string]any)
	if total["memory_mib"] != float64(1024) || total["running"] != float64(1) || total["disk_bytes"].(float64) < 1<<20 {
		t.Errorf("totals %v", total)
	}
}
