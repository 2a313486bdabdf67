package jail

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
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

// fakeCgroupRoot lays out files (path -> content) under a temporary
// cgroup root.
func fakeCgroupRoot(t *testing.T, files map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, v := range files {
		p := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(v), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestPlanCgroups: root gets a v1 or v2 cgroup where the hierarchy offers
// the memory and pids controllers; where none does (nothing mounted, as
// inside `ip netns exec`, or a controller missing), root falls back to
// rlimits with a warning naming why and the fix, as a normal user does,
// instead of refusing the run.
func TestPlanCgroups(t *testing.T) {
	own := ownCgroups("/proc/self/cgroup")
	v1 := map[string]string{"memory/cgroup.procs": "", "pids/cgroup.procs": ""}
	v2 := map[string]string{"cgroup.controllers": "cpuset cpu io memory pids\n"}
	for _, tt := range []struct {
		name  string
		files map[string]string // nil: the root does not exist
		euid  int
		kind  cgroupKind
		says  []string // in the warning
	}{
		{"root, v1", v1, 0, cgroupV1, nil},
		{"root, v2", v2, 0, cgroupV2, nil},
		{"root, nothing mounted", map[string]string{}, 0, cgroupNone,
			[]string{"no cgroup filesystem is mounted at ROOT", "ip netns exec", "capped with rlimits instead", "nsenter --net="}},
		{"root, no root directory", nil, 0, cgroupNone, []string{"no cgroup filesystem is mounted at ROOT", "capped with rlimits instead"}},
		{"root, v1 without pids", map[string]string{"memory/cgroup.procs": ""}, 0, cgroupNone,
			[]string{"the v1 hierarchy ROOT/pids is mounted", "capped with rlimits instead"}},
		{"root, v2 without memory", map[string]string{"cgroup.controllers": "cpu io pids\n"}, 0, cgroupNone,
			[]string{"does not offer the memory and pids controllers", "capped with rlimits instead"}},
		{"user, v1", v1, 1000, cgroupNone, []string{"delegated cgroup v2 subtree", "capped with rlimits instead", "systemd user session"}},
		{"user, nothing mounted", map[string]string{}, 1000, cgroupNone, []string{"capped with rlimits instead", "systemd user session"}},
		{"user, v2 not delegated", v2, 1000, cgroupNone, []string{"no delegated cgroup v2 subtree", "capped with rlimits instead"}},
	} {
		root := filepath.Join(t.TempDir(), "absent")
		if tt.files != nil {
			root = fakeCgroupRoot(t, tt.files)
		}
		p, warn := planCgroups(root, tt.euid)
		if p.kind != tt.kind || (len(tt.says) == 0) != (len(warn) == 0) {
			t.Errorf("%s: plan %+v, warnings %q; want %s", tt.name, p, warn, tt.kind)
			continue
		}
		for _, s := range tt.says {
			if s = strings.ReplaceAll(s, "ROOT", root); !strings.Contains(warn[0], s) {
				t.Errorf("%s: warning %q does not say %q", tt.name, warn[0], s)
			}
		}
		var want []string
		switch tt.kind {
		case cgroupV1:
			want = []string{filepath.Join(root, "memory", own["memory"], "isopod"), filepath.Join(root, "pids", own["pids"], "isopod")}
		case cgroupV2:
			want = []string{filepath.Join(root, "isopod")}
		}
		if !slices.Equal(p.parents, want) {
			t.Errorf("%s: parents %q; want %q", tt.name, p.parents, want)
		}
	}
}

// TestConfinedWithoutCgroups: isopod as root on a host whose cgroup root
// holds nothing (here, an empty directory for /sys/fs/cgroup, as inside
// `ip netns exec`) sets the jail up and starts the process capped with
// rlimits, and says so.
func TestConfinedWithoutCgroups(t *testing.T) {
	if testing.Short() {
		t.Skip("starts confined processes; skipped under -short")
	}
	if os.Geteuid() != 0 {
		t.Skip("root's fallback; a normal user's is TestConfinedAsUser's")
	}
	j, err := New(Config{CgroupRoot: t.TempDir()})
	if err != nil {
		t.Fatalf("an empty cgroup root: %v; want rlimits and a warning", err)
	}
	if w := j.Warnings(); j.cgroups.kind != cgroupNone || len(w) != 1 || !strings.Contains(w[0], "capped with rlimits instead") {
		t.Fatalf("cgroups %s, warnings %q; want the rlimit fallback and its warning", j.cgroups.kind, w)
	}
	p, err := startJailed(t, j, sleeper(t))
	if err != nil {
		t.Fatal(err)
	}
	checkRlimits(t, p.Pid, map[string]uint64{"Max address space": 64<<20 + addressSpaceSlack, "Max processes": 16, "Max core file size": 0})
	if got := strings.Fields(statusField(t, p.Pid, "Uid"))[0]; got != strconv.Itoa(j.UID()) {
		t.Errorf("uid %s; want the jail's %d", got, j.UID())
	}
}
