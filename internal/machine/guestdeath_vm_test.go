package machine_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/vmm/vmmfake"
)

// TestDied: a guest whose VMM went away is reaped, and the reason is read
// from the end of its console log, however long the log; the Machine
// holds no VM afterwards.
func TestDied(t *testing.T) {
	m, drv := bootFake(t, vmmfake.Config{})
	console := filepath.Join(t.TempDir(), "console.log")
	log := strings.Repeat("[    1.0] noise\n", 4096) + "[    2.5] Kernel panic - not syncing: VFS: Unable to mount root fs\n"
	if err := os.WriteFile(console, []byte(log), 0o600); err != nil {
		t.Fatal(err)
	}
	drv.Machines()[0].Crash(errors.New("gone"))
	if got, want := m.Died(console), "kernel panic: VFS: Unable to mount root fs"; got != want {
		t.Errorf("Died = %q; want %q", got, want)
	}
	if vm, c := m.Current(); vm != nil || c != nil {
		t.Errorf("the Machine still holds its VM after Died")
	}
	select {
	case <-drv.Machines()[0].Done():
	case <-time.After(5 * time.Second):
		t.Error("the VMM still runs after Died")
	}

	m2, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m2.Halt(ctx, 5*time.Second)
	if got := m2.Died(filepath.Join(t.TempDir(), "none")); got != "the guest stopped without a word on its console" {
		t.Errorf("Died without a console log = %q", got)
	}
}
