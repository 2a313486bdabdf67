package ledger_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"

	"isopod/internal/ledger"
)

// holder opens a handle for this process under its own key: one test
// plays several holder processes.
func holder(t *testing.T, dir, key string) *ledger.Ledger {
	t.Helper()
	h := ledger.Self(key)
	h.Key = key
	l, err := ledger.Open(dir, h)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func begin(t *testing.T, l *ledger.Ledger) *ledger.Tx {
	t.Helper()
	tx, err := l.Begin()
	if err != nil {
		t.Fatal(err)
	}
	return tx
}

func TestTwoHolders(t *testing.T) {
	dir := t.TempDir()
	a, b := holder(t, dir, "a"), holder(t, dir, "b")
	tx := begin(t, a)
	if len(tx.Others) != 0 {
		t.Fatalf("an empty ledger has entries: %+v", tx.Others)
	}
	if err := tx.Commit([]ledger.Item{{Kind: ledger.KindSession, CostMiB: 896, ID: "ses-1"}, {Kind: ledger.KindRun, CostMiB: 1280}}, 0); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, b)
	if u := ledger.Sum(tx.Others); u.Places != 2 || u.CostMiB != 896+1280 {
		t.Errorf("b sees %+v, want a's 2 places and 2176 MiB", u)
	}
	if err := tx.Commit(nil, 1); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, a)
	if u := ledger.Sum(tx.Others); u.Places != 0 || u.Waiting != 1 {
		t.Errorf("a sees %+v, want b's one waiting call", u)
	}
	tx.Abort()
	if err := a.Clear(); err != nil {
		t.Fatal(err)
	}
	all, err := ledger.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 1 || all[0].Label != "b" || all[0].Waiting != 1 {
		t.Errorf("entries after a cleared: %+v", all)
	}
}

// TestDeadHolderIgnored writes an entry for a child process that then
// exits: the entry is ignored and removed.
func TestDeadHolderIgnored(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command("cat")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	child, err := ledger.Open(dir, ledger.Holder{PID: cmd.Process.Pid, Start: ledger.ProcStart(cmd.Process.Pid), Label: "child"})
	if err != nil {
		stdin.Close()
		cmd.Wait()
		t.Fatal(err)
	}
	if err := begin(t, child).Commit([]ledger.Item{{Kind: ledger.KindRun, CostMiB: 1280}}, 0); err != nil {
		t.Fatal(err)
	}
	me := holder(t, dir, "me")
	tx := begin(t, me)
	if u := ledger.Sum(tx.Others); u.Places != 1 {
		t.Fatalf("a live child's place is not seen: %+v", u)
	}
	tx.Abort()
	stdin.Close()
	cmd.Wait()
	// A holder that died writing its entry leaves a temporary file.
	if err := os.WriteFile(filepath.Join(dir, "gone.json.tmp"), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	tx = begin(t, me)
	if len(tx.Others) != 0 {
		t.Errorf("an exited holder's entry counts: %+v", tx.Others)
	}
	tx.Abort()
	files, _ := filepath.Glob(filepath.Join(dir, "*.json*"))
	if len(files) != 0 {
		t.Errorf("an exited holder's entry is left: %v", files)
	}
}

// TestConcurrentHolders has holders on goroutines take and give back
// places under a limit: the ledger's lock keeps them within it.
func TestConcurrentHolders(t *testing.T) {
	dir := t.TempDir()
	const limit, holders, rounds = 3, 8, 25
	var inUse, peak, taken atomic.Int32
	var wg sync.WaitGroup
	for i := range holders {
		l := holder(t, dir, string(rune('a'+i)))
		wg.Go(func() {
			for range rounds {
				tx, err := l.Begin()
				if err != nil {
					t.Error(err)
					return
				}
				if ledger.Sum(tx.Others).Places >= limit {
					tx.Abort()
					continue
				}
				n := inUse.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				taken.Add(1)
				if err := tx.Commit([]ledger.Item{{Kind: ledger.KindRun, CostMiB: 1}}, 0); err != nil {
					t.Error(err)
				}
				// Hold the place a moment outside the lock, then give it back.
				tx = begin(t, l)
				inUse.Add(-1)
				if err := tx.Commit(nil, 0); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if p := peak.Load(); p > limit {
		t.Errorf("%d places held at once, limit %d", p, limit)
	}
	if taken.Load() == 0 {
		t.Error("no holder ever took a place")
	}
	if all, _ := ledger.Read(dir); len(all) != 0 {
		t.Errorf("entries left: %+v", all)
	}
}

func TestOpenRefusesUnknownHolder(t *testing.T) {
	if _, err := ledger.Open(t.TempDir(), ledger.Holder{PID: os.Getpid()}); err == nil {
		t.Error("a holder without a start time was accepted")
	}
}
