package agent

import (
	"os"
	"path/filepath"
	"testing"
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
