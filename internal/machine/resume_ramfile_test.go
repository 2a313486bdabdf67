package machine_test

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// TestResumePausedRanOnRAMFile: a resume that fails once the guest ran on
// the pause's RAM file itself leaves a pause that is not what it was
// (pausefile.ErrChanged); one that fails before the guest runs, or whose
// RAM was a copy, does not.
func TestResumePausedRanOnRAMFile(t *testing.T) {
	var crash atomic.Bool
	drv, err := vmmfake.New(vmmfake.Config{
		FailRestore: func(cfg vmm.Config, _ string) error {
			if cfg.ID == "fail-restore" {
				return errors.New("no QEMU")
			}
			return nil
		},
		OnRequest: func(m *vmmfake.Machine, msg *agentproto.Msg) {
			if crash.Load() && msg.Kind == agentproto.KindHello {
				m.Crash(errors.New("the guest died"))
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	cfg := fakeConfig(t)
	v := machine.New(nil)
	if err := v.Boot(ctx, drv, cfg); err != nil {
		t.Fatal(err)
	}
	snap := t.TempDir()
	if err := v.Snapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	v.Drop()
	crash.Store(true)
	for _, c := range []struct {
		name, id, ramFile string
		changed           bool
	}{
		{"guest ran on the RAM file", "vm-0000000b", filepath.Join(cfg.Dir, "ram"), true},
		{"guest ran on a copy", "vm-0000000c", "", false},
		{"restore failed", "fail-restore", filepath.Join(cfg.Dir, "ram"), false},
	} {
		rc := cfg
		rc.ID, rc.RAMFile, rc.OwnRAM = c.id, c.ramFile, true
		w := machine.New(nil)
		_, _, err := w.ResumePaused(ctx, drv, rc, snap, false, "h", func(vmm.Machine) {})
		w.Drop()
		if err == nil || errors.Is(err, pausefile.ErrChanged) != c.changed {
			t.Errorf("%s: %v; want a failure, changed %v", c.name, err, c.changed)
		}
	}
}
