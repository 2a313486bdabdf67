package jail

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A sweep removes only its own scope's cgroups that keep does not claim:
// another state root's, and unscoped ones, stay.
func TestSweepCgroupsStaysInScope(t *testing.T) {
	parent := t.TempDir()
	j := &Jailer{scope: "aaaa1111", cgroups: cgroupPlan{kind: cgroupV1, parents: []string{parent}}}
	for _, name := range []string{"isopod-aaaa1111-vm-dead", "isopod-aaaa1111-vm-live", "isopod-bbbb2222-vm-other", "isopod-vm-unscoped", "unrelated"} {
		if err := os.Mkdir(filepath.Join(parent, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	removed := j.SweepCgroups(func(id string) bool { return id == "vm-live" })
	if len(removed) != 1 || removed[0] != "isopod-aaaa1111-vm-dead" {
		t.Errorf("removed %v; want only isopod-aaaa1111-vm-dead", removed)
	}
	left, _ := os.ReadDir(parent)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	if want := []string{"isopod-aaaa1111-vm-live", "isopod-bbbb2222-vm-other", "isopod-vm-unscoped", "unrelated"}; !slices.Equal(names, want) {
		t.Errorf("left %v; want %v", names, want)
	}
	if got := j.CgroupName("vm-x"); got != "isopod-aaaa1111-vm-x" {
		t.Errorf("CgroupName = %q", got)
	}
}
