package sandbox

import (
	"strings"
	"testing"
)

// TestPlanDisksLayersReadOnly: the base and every stage layer are attached
// read-only, root first; only the scratch disk is writable.
func TestPlanDisksLayersReadOnly(t *testing.T) {
	pl := &plan{
		base:   baseImage{Flavor: "base-min", Path: "/img/base-min.sqfs"},
		layers: []string{"/stages/a/layer.ext4", "/stages/b/layer.ext4"},
	}
	disks := pl.disks("/vm/scratch.ext4")
	want := []struct {
		path, serial string
		ro           bool
	}{
		{"/img/base-min.sqfs", "isopod-base", true},
		{"/stages/a/layer.ext4", "isopod-l0", true},
		{"/stages/b/layer.ext4", "isopod-l1", true},
		{"/vm/scratch.ext4", "isopod-scratch", false},
	}
	if len(disks) != len(want) {
		t.Fatalf("disks %+v; want %d", disks, len(want))
	}
	for i, w := range want {
		if d := disks[i]; d.Path != w.path || d.Serial != w.serial || d.ReadOnly != w.ro {
			t.Errorf("disk %d: %+v; want %s %s read-only=%v", i, d, w.path, w.serial, w.ro)
		}
	}
	if cl := pl.cmdline("box"); !strings.Contains(cl, "isopod.layers=2") || !strings.Contains(cl, "isopod.hostname=box") {
		t.Errorf("cmdline %q does not carry the layer count and hostname", cl)
	}
}
