package agent

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestCommandMemMax(t *testing.T) {
	for _, tt := range []struct{ total, want int64 }{
		{512 << 20, 448 << 20},   // an eighth kept
		{256 << 20, 208 << 20},   // at least 48 MiB kept
		{4096 << 20, 3584 << 20}, // an eighth kept
		{40 << 20, 16 << 20},     // never below 16 MiB
	} {
		if got := commandMemMax(tt.total); got != tt.want {
			t.Errorf("commandMemMax(%d MiB) = %d MiB; want %d MiB", tt.total>>20, got>>20, tt.want>>20)
		}
	}
}

func TestMemTotal(t *testing.T) {
	p := filepath.Join(t.TempDir(), "meminfo")
	os.WriteFile(p, []byte("MemFree:  100 kB\nMemTotal:  1024 kB\n"), 0o644)
	if got, err := memTotal(p); err != nil || got != 1<<20 {
		t.Errorf("memTotal = %d, %v; want 1 MiB", got, err)
	}
	os.WriteFile(p, []byte("MemFree: 1 kB\n"), 0o644)
	if _, err := memTotal(p); err == nil {
		t.Error("no MemTotal line: no error")
	}
	// Unconfined: every method is a no-op.
	var g *Cgroups
	e := g.forExec(1)
	e.killAll()
	e.remove()
}

// An exec takes the cgroup made ahead for it; without one it makes its
// own. settle returns once every finished exec's clean-up has ended.
func TestSpareCgroupAndSettle(t *testing.T) {
	parent := t.TempDir()
	g := &Cgroups{parent: parent, log: slog.New(slog.DiscardHandler)}
	g.refill()
	e := g.forExec(5)
	if e == nil || filepath.Base(e.dir) != "spare-1" {
		t.Fatalf("first exec's cgroup %+v; want the spare made ahead", e)
	}
	if f := g.forExec(6); f == nil || filepath.Base(f.dir) != "exec-6" {
		t.Fatalf("second exec's cgroup %+v; want exec-6, made at once", f)
	}
	g.begin()
	ended := make(chan struct{})
	go func() {
		time.Sleep(50 * time.Millisecond)
		g.refill()
		close(ended)
		g.end()
	}()
	g.settle()
	select {
	case <-ended:
	default:
		t.Fatal("settle returned before the clean-up ended")
	}
	if !g.spare.ready() {
		t.Error("no spare cgroup after the clean-up")
	}
}
