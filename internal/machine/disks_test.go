package machine

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/vmm"
)

type wantDisk struct {
	path, serial string
	ro           bool
}

func checkDisks(t *testing.T, what string, got []vmm.Disk, want []wantDisk) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: disks %+v; want %d", what, got, len(want))
	}
	for i, w := range want {
		if d := got[i]; d.Path != w.path || d.Serial != w.serial || d.ReadOnly != w.ro {
			t.Errorf("%s: disk %d: %+v; want %s %s read-only=%v", what, i, d, w.path, w.serial, w.ro)
		}
	}
}

// TestRunDisks: a cold boot attaches what the run uses, the base and every
// stage layer read-only, root first, the scratch and workspace layer
// writable; a snapshot VM's slots are all there, in a fixed order with
// fixed flags, backed by the run's files or placeholders; the Mount names
// the same disks.
func TestRunDisks(t *testing.T) {
	base, layers := "/img/base-min.sqfs", []string{"/stages/a/layer.ext4", "/stages/b/layer.ext4"}
	d := Disks{Base: base, Layers: layers, Scratch: "/vm/scratch.ext4", Workspace: "/vm/ws.sqfs", WorkspaceUpper: "/vm/ws-upper.ext4"}
	checkDisks(t, "cold", d.Cold(), []wantDisk{
		{"/img/base-min.sqfs", "isopod-base", true},
		{"/stages/a/layer.ext4", "isopod-l0", true},
		{"/stages/b/layer.ext4", "isopod-l1", true},
		{"/vm/scratch.ext4", "isopod-scratch", false},
		{"/vm/ws.sqfs", "isopod-ws", true},
		{"/vm/ws-upper.ext4", "isopod-ws-upper", false},
	})
	want := []wantDisk{{"/img/base-min.sqfs", "isopod-base", true},
		{"/stages/a/layer.ext4", "isopod-l0", true}, {"/stages/b/layer.ext4", "isopod-l1", true}}
	for i := 2; i < 10; i++ {
		want = append(want, wantDisk{"RO", "isopod-l" + string(rune('0'+i)), true})
	}
	want = append(want, wantDisk{"/vm/scratch.ext4", "isopod-scratch", false},
		wantDisk{"RO", "isopod-ws", true}, wantDisk{"RW1", "isopod-ws-upper", false})
	checkDisks(t, "slots without a workspace", Disks{Base: base, Layers: layers, Scratch: "/vm/scratch.ext4"}.Slots(SlotPlaceholders{RO: "RO", RW: [2]string{"RW0", "RW1"}}), want)
	m := d.Mount("/workspace", true, time.Now().Add(time.Minute))
	if m.Layers != 2 || !m.Scratch || !m.Flush || m.Workspace != "/workspace" || m.WaitMS <= 0 {
		t.Errorf("mount %+v", m)
	}
	if m := (Disks{Base: base, Layers: layers, Scratch: "/s"}).Mount("/workspace", false, time.Now()); m.Workspace != "" || m.WaitMS != 1 {
		t.Errorf("mount without a workspace, past the deadline: %+v", m)
	}
	if cl := Cmdline("box"); strings.Contains(cl, "isopod.layers") || !strings.Contains(cl, "isopod.hostname=box") {
		t.Errorf("cmdline %q: the disks come as a Mount; the hostname stays", cl)
	}
}

// TestPlaceholders: a VM that may boot for a snapshot gets placeholder
// disks of the size its clones' guests see; a clone's are empty, so that
// its guest can write nothing into them, also where a snapshot VM's were.
func TestPlaceholders(t *testing.T) {
	for _, tt := range []struct {
		name string
		make func(string) (SlotPlaceholders, error)
		size int64
	}{
		{"snapshot VM", SnapshotPlaceholders, SlotBytes},
		{"clone", Placeholders, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			ph, err := tt.make(dir)
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range []string{ph.RO, ph.RW[0], ph.RW[1]} {
				st, err := os.Stat(p)
				if err != nil || st.Size() != tt.size || filepath.Dir(p) != dir {
					t.Errorf("%s: %v, %v; want %d bytes", p, st, err, tt.size)
				}
			}
			if ph2, err := tt.make(dir); err != nil || ph2 != ph {
				t.Errorf("second call: %+v %v", ph2, err)
			}
		})
	}
	// A clone in the directory of a snapshot VM, which ran there before,
	// finds them cut; a snapshot VM after a clone, grown.
	dir := t.TempDir()
	for _, tt := range []struct {
		make func(string) (SlotPlaceholders, error)
		size int64
	}{{SnapshotPlaceholders, SlotBytes}, {Placeholders, 0}, {SnapshotPlaceholders, SlotBytes}} {
		ph, err := tt.make(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range []string{ph.RO, ph.RW[0], ph.RW[1]} {
			if st, err := os.Stat(p); err != nil || st.Size() != tt.size {
				t.Errorf("%s: %v, %v; want %d bytes", p, st, err, tt.size)
			}
		}
	}
}

// TestCutPlaceholders: a paused VM's writable placeholders are emptied
// before its resume; its other disks keep their bytes.
func TestCutPlaceholders(t *testing.T) {
	dir := t.TempDir()
	ph, err := SnapshotPlaceholders(dir)
	if err != nil {
		t.Fatal(err)
	}
	scratch := filepath.Join(dir, "scratch.ext4")
	if err := os.WriteFile(scratch, []byte("data"), 0o600); err != nil {
		t.Fatal(err)
	}
	disks := Disks{Base: "/b", Scratch: scratch}.Slots(ph)
	if err := CutPlaceholders(disks); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[string]int64{ph.RO: SlotBytes, ph.RW[0]: SlotBytes, ph.RW[1]: 0, scratch: 4} {
		if st, err := os.Stat(p); err != nil || st.Size() != want {
			t.Errorf("%s: %v, %v; want %d bytes", p, st, err, want)
		}
	}
}

// TestSlotPlaces: FitSlots cuts the slots Slots puts the scratch disk and
// the workspace's writable layer in.
func TestSlotPlaces(t *testing.T) {
	slots := Disks{Base: "/b"}.Slots(SlotPlaceholders{RO: "/ro", RW: [2]string{"/rw0", "/rw1"}})
	for i, want := range map[int]string{slotScratch: agentproto.SerialScratch, slotWorkspaceUpper: agentproto.SerialWorkspaceUpper} {
		if d := slots[i]; d.Serial != want || d.ReadOnly {
			t.Errorf("slot %d is %+v; want the writable %s", i, d, want)
		}
	}
}
