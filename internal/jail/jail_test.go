//go:build linux

package jail

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// fakeProcSys writes kernel tunables under a temporary /proc/sys.
func fakeProcSys(t *testing.T, values map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	for name, v := range values {
		p := filepath.Join(dir, name)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestUserNamespacesRefused: a host whose settings forbid user namespaces
// is refused, naming the setting, the fix and the way out.
func TestUserNamespacesRefused(t *testing.T) {
	for _, tt := range []struct {
		name   string
		values map[string]string
		euid   int
		label  string // the AppArmor label
		says   string // empty: accepted
	}{
		{"allowed", map[string]string{"user/max_user_namespaces": "15000"}, 1000, "", ""},
		{"disabled for all", map[string]string{"user/max_user_namespaces": "0"}, 0, "", "user.max_user_namespaces = 0"},
		{"debian's switch", map[string]string{"user/max_user_namespaces": "15000", "kernel/unprivileged_userns_clone": "0"}, 1000, "", "kernel.unprivileged_userns_clone"},
		{"debian's switch does not bind root", map[string]string{"user/max_user_namespaces": "15000", "kernel/unprivileged_userns_clone": "0"}, 0, "", ""},
		{"apparmor", map[string]string{"user/max_user_namespaces": "15000", "kernel/apparmor_restrict_unprivileged_userns": "1"}, 1000, "unconfined", "AppArmor"},
		{"apparmor, no label", map[string]string{"kernel/apparmor_restrict_unprivileged_userns": "1"}, 1000, "", "AppArmor"},
		{"apparmor does not bind root", map[string]string{"kernel/apparmor_restrict_unprivileged_userns": "1"}, 0, "unconfined", ""},
		{"apparmor off", map[string]string{"kernel/apparmor_restrict_unprivileged_userns": "0"}, 1000, "unconfined", ""},
		{"apparmor, under isopod's profile", map[string]string{"kernel/apparmor_restrict_unprivileged_userns": "1"}, 1000, "isopod (unconfined)", ""},
	} {
		err := checkUserNamespaces(fakeProcSys(t, tt.values), tt.euid, tt.label)
		if tt.says == "" {
			if err != nil {
				t.Errorf("%s: %v", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), tt.says) ||
			!strings.Contains(err.Error(), knobs.Jail+"=off") || !strings.Contains(err.Error(), "sysctl -w") {
			t.Errorf("%s: %v; want a precondition error naming %q, the fix and %s=off", tt.name, err, tt.says, knobs.Jail)
		}
		if strings.HasPrefix(tt.name, "apparmor") && (!strings.Contains(err.Error(), "README.md") ||
			!strings.Contains(err.Error(), "userns,") || !strings.Contains(err.Error(), "kernel.apparmor_restrict_unprivileged_userns=0")) {
			t.Errorf("%s: %v; want the profile README.md gives and the sysctl", tt.name, err)
		}
	}
}

// TestUserNamespaceProbe: this host lets the tests make user namespaces,
// and each way the probe can fail is refused with its cause and fix.
func TestUserNamespaceProbe(t *testing.T) {
	if err := probeUserNamespace(); err != nil {
		t.Logf("no user namespaces for this process: %v", userNamespaceRefused(err))
	}
	if userNamespaceRefused(nil) != nil {
		t.Error("no failure, but refused")
	}
	for errno, says := range map[syscall.Errno]string{
		syscall.ENOSPC: "user.max_user_namespaces",
		syscall.EPERM:  "seccomp",
		syscall.EINVAL: "CONFIG_USER_NS",
	} {
		err := userNamespaceRefused(errno)
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "user namespace") ||
			!strings.Contains(err.Error(), says) || !strings.Contains(err.Error(), knobs.Jail+"=off") {
			t.Errorf("%v: %v; want a precondition error naming user namespaces and %q", errno, err, says)
		}
	}
}

func TestSubordinate(t *testing.T) {
	p := filepath.Join(t.TempDir(), "subuid")
	os.WriteFile(p, []byte("alice:100000:65536\n1001:200000:65536\nbob:0:10\n"), 0o644)
	for _, tt := range []struct {
		name string
		uid  int
		want int
		ok   bool
	}{
		{"alice", 1000, 100000, true},
		{"carol", 1001, 200000, true}, // by uid
		{"bob", 1002, 0, false},       // a range at 0 is not taken
		{"dave", 1003, 0, false},
	} {
		got, err := subordinate(p, tt.name, tt.uid)
		if tt.ok != (err == nil) || got != tt.want {
			t.Errorf("subordinate(%s) = %d, %v", tt.name, got, err)
		}
	}
}

func TestOwnCgroupsAndV1Plan(t *testing.T) {
	p := filepath.Join(t.TempDir(), "cgroup")
	os.WriteFile(p, []byte("9:name=systemd:/\n4:memory:/runner/abc\n1:cpu,cpuacct:/x\n0::/\n"), 0o644)
	got := ownCgroups(p)
	if got["memory"] != "/runner/abc" || got["cpu"] != "/x" || got["cpuacct"] != "/x" || got[""] != "/" {
		t.Errorf("ownCgroups: %v", got)
	}
}

// TestCgroupLimits makes a VMM cgroup in fake v1 and v2 hierarchies and
// checks the limits written, and that remove takes it away.
func TestCgroupLimits(t *testing.T) {
	lim := Limits{MemoryBytes: 1 << 30, Pids: 512, CPUWeight: 100}
	root := t.TempDir()
	p := cgroupPlan{kind: cgroupV1}
	for _, c := range v1Controllers {
		p.parents = append(p.parents, filepath.Join(root, c, "isopod"))
	}
	c, err := p.create("vm-1", lim, os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	for file, want := range map[string]string{
		"memory/isopod/vm-1/memory.limit_in_bytes": "1073741824",
		"pids/isopod/vm-1/pids.max":                "512",
	} {
		if b, err := os.ReadFile(filepath.Join(root, file)); err != nil || string(b) != want {
			t.Errorf("%s = %q, %v; want %q", file, b, err, want)
		}
	}
	// The fake directories are not empty (they hold the limit files), so
	// remove cannot take them; a real cgroup directory is removed with
	// rmdir once empty.
	c.dirs = nil
	v2 := cgroupPlan{kind: cgroupV2, parents: []string{filepath.Join(root, "unified", "isopod")}}
	c2, err := v2.create("vm-2", lim, os.Getuid(), os.Getgid())
	if err != nil {
		t.Fatal(err)
	}
	defer c2.fd.Close()
	for file, want := range map[string]string{"memory.max": "1073741824", "memory.swap.max": "0", "pids.max": "512", "cpu.weight": "100"} {
		if b, err := os.ReadFile(filepath.Join(root, "unified", "isopod", "vm-2", file)); err != nil || string(b) != want {
			t.Errorf("v2 %s = %q, %v; want %q", file, b, err, want)
		}
	}
	if none, err := (cgroupPlan{kind: cgroupNone}).create("vm-3", lim, os.Getuid(), os.Getgid()); none != nil || err != nil {
		t.Errorf("no cgroups: %v, %v", none, err)
	}
}

func TestRlimits(t *testing.T) {
	got := map[int]uint64{}
	for _, r := range rlimitsFor(Limits{MemoryBytes: 1 << 30, Pids: 512}) {
		got[r.Resource] = r.Max
	}
	if got[syscall.RLIMIT_AS] != 1<<30+addressSpaceSlack || got[syscall.RLIMIT_CORE] != 0 || got[syscall.RLIMIT_NOFILE] == 0 || got[6] != 512 { // 6: RLIMIT_NPROC
		t.Errorf("rlimits %v", got)
	}
}

// TestBindsResolveOnTheHost: symlinks are resolved before the helper runs
// (an absolute link would otherwise point into the jail's empty root), and
// a missing path is refused before anything starts.
func TestBindsResolveOnTheHost(t *testing.T) {
	dir := t.TempDir()
	real := filepath.Join(dir, "real")
	os.WriteFile(real, []byte("x"), 0o644)
	link := filepath.Join(dir, "link")
	os.Symlink(real, link)
	b, err := Spec{Path: link, ReadOnly: []string{link}}.binds()
	if err != nil {
		t.Fatal(err)
	}
	if len(b) != 1+len(defaultDevices) || b[0].Src != real || b[0].At != link || b[0].Dev {
		t.Errorf("binds %+v", b)
	}
	if _, err := (Spec{Path: filepath.Join(dir, "missing")}).binds(); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("missing path: %v", err)
	}
	if _, err := (Spec{Path: "relative"}).binds(); err == nil {
		t.Error("relative path accepted")
	}
}
