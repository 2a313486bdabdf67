//go:build linux

package jail

import (
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// newTestJailer returns a Jailer for this host or skips, saying why.
func newTestJailer(t *testing.T) *Jailer {
	t.Helper()
	if testing.Short() {
		t.Skip("starts confined processes; skipped under -short")
	}
	j, err := New(Config{})
	if err != nil {
		t.Skipf("no jail on this host: %v", err)
	}
	return j
}

// startJailed starts spec confined from a locked thread and returns the
// process once it runs the program; the test's cleanup kills it.
func startJailed(t *testing.T, j *Jailer, spec Spec) (*Process, error) {
	t.Helper()
	p, err := j.Command(spec)
	if err != nil {
		return nil, err
	}
	res := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread() // the parent-death signal follows this thread
		defer runtime.UnlockOSThread()
		if err := p.Cmd.Start(); err != nil {
			p.Cleanup()
			res <- err
			close(exited)
			return
		}
		err := p.Started()
		res <- err
		p.Cmd.Wait()
		p.Cleanup()
		close(exited)
	}()
	t.Cleanup(func() {
		if p.Cmd.Process != nil {
			syscall.Kill(-p.Cmd.Process.Pid, syscall.SIGKILL)
		}
		<-exited
	})
	if err := <-res; err != nil {
		return nil, err
	}
	return p, nil
}

func sleeper(t *testing.T) Spec {
	t.Helper()
	libs, err := Libraries("/bin/sleep")
	if err != nil {
		t.Skipf("cannot list /bin/sleep's libraries: %v", err)
	}
	return Spec{Name: "jail-test-" + strconv.Itoa(os.Getpid()) + "-" + t.Name(), Path: "/bin/sleep", Args: []string{"60"},
		ReadOnly: libs, Limits: Limits{MemoryBytes: 64 << 20, Pids: 16, CPUWeight: 100}}
}

func statusField(t *testing.T, pid int, field string) string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return ""
}

// TestConfined checks a confined process from the outside: no
// capabilities, no_new_privs, not the invoking uid, namespaces of its own,
// a root with only what it was given, and its cgroup caps.
func TestConfined(t *testing.T) {
	j := newTestJailer(t)
	home, _ := os.UserHomeDir()
	marker := filepath.Join(home, ".isopod-jail-test-marker")
	if err := os.WriteFile(marker, []byte("secret"), 0o600); err == nil {
		t.Cleanup(func() { os.Remove(marker) })
	}
	p, err := startJailed(t, j, sleeper(t))
	if err != nil {
		t.Fatal(err)
	}
	checkConfined(t, j, p.Pid, marker)
	checkCgroup(t, j, p.Pid)
}

// checkConfined checks a confined process from the outside: no
// capabilities, no_new_privs, the jail's uid, namespaces of its own, and a
// read-only root with only what it was given (not marker).
func checkConfined(t *testing.T, j *Jailer, pid int, marker string) {
	t.Helper()
	for field, want := range map[string]string{"CapEff": "0000000000000000", "CapPrm": "0000000000000000",
		"CapBnd": "0000000000000000", "CapAmb": "0000000000000000", "NoNewPrivs": "1"} {
		if got := statusField(t, pid, field); got != want {
			t.Errorf("%s: %s; want %s", field, got, want)
		}
	}
	uid := strings.Fields(statusField(t, pid, "Uid"))[0]
	if uid != strconv.Itoa(j.UID()) || uid == strconv.Itoa(os.Getuid()) && os.Getuid() == 0 {
		t.Errorf("uid %s; want the jail's %d, not the invoking user's", uid, j.UID())
	}
	if os.Getenv(asUserEnv) == "1" {
		// Run by TestConfinedAsUser, as a user with a subordinate range.
		if uid == strconv.Itoa(os.Getuid()) || j.ids.mode != mapHelper {
			t.Errorf("uid %s as user %d: want a subordinate id (warnings %v)", uid, os.Getuid(), j.Warnings())
		}
		if gid := strings.Fields(statusField(t, pid, "Gid"))[0]; gid != strconv.Itoa(j.GID()) || gid == strconv.Itoa(os.Getgid()) {
			t.Errorf("gid %s as user %d: want the subordinate gid %d", gid, os.Getuid(), j.GID())
		}
	}
	for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		theirs, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		if err != nil || theirs == mine {
			t.Errorf("%s namespace %q is isopod's %q (%v)", ns, theirs, mine, err)
		}
	}
	root := "/proc/" + strconv.Itoa(pid) + "/root"
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch e.Name() {
		case "bin", "usr", "lib", "lib64", "etc", "dev", "proc":
		default:
			t.Errorf("the jail's root holds %s", e.Name())
		}
	}
	if _, err := os.Stat(root + marker); err == nil {
		t.Errorf("%s is reachable from the jail", marker)
	}
	if f, err := os.OpenFile(root+"/usr/newfile", os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
		t.Error("the jail's root is writable")
	}
}

// checkCgroup finds the process's memory and pids caps where the plan put
// them.
func checkCgroup(t *testing.T, j *Jailer, pid int) {
	t.Helper()
	if j.cgroups.kind == cgroupNone {
		t.Logf("no cgroups on this host; rlimits instead: %v", j.Warnings())
		checkRlimits(t, pid, map[string]uint64{"Max address space": 64<<20 + addressSpaceSlack, "Max processes": 16, "Max core file size": 0})
		return
	}
	own := ownCgroups("/proc/" + strconv.Itoa(pid) + "/cgroup")
	files := map[string]string{"memory": "memory.limit_in_bytes", "pids": "pids.max"}
	for ctrl, file := range files {
		path := own[ctrl]
		dir := filepath.Join("/sys/fs/cgroup", ctrl, path)
		if j.cgroups.kind == cgroupV2 {
			dir = filepath.Join("/sys/fs/cgroup", own[""])
			file = map[string]string{"memory": "memory.max", "pids": "pids.max"}[ctrl]
		}
		b, err := os.ReadFile(filepath.Join(dir, file))
		want := map[string]string{"memory": strconv.Itoa(64 << 20), "pids": "16"}[ctrl]
		if err != nil || strings.TrimSpace(string(b)) != want || !strings.Contains(dir, "/isopod/") {
			t.Errorf("%s cgroup %s: %s = %q (%v); want %s", ctrl, dir, file, b, err, want)
		}
	}
}

// checkRlimits finds the process's soft and hard limits (named as in
// /proc/PID/limits) at want.
func checkRlimits(t *testing.T, pid int, want map[string]uint64) {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	for name, v := range want {
		found := false
		for _, line := range strings.Split(string(b), "\n") {
			rest, ok := strings.CutPrefix(line, name+" ")
			if !ok {
				continue
			}
			found = true
			if f := strings.Fields(rest); len(f) < 2 || f[0] != strconv.FormatUint(v, 10) || f[1] != f[0] {
				t.Errorf("%s: %q; want %d (soft and hard)", name, strings.TrimSpace(rest), v)
			}
		}
		if !found {
			t.Errorf("no %q in /proc/%d/limits", name, pid)
		}
	}
}

// TestDeviceGroup: a device the VMM must open (/dev/kvm) opens only when
// the jail's ids carry its group; without, the start is refused naming
// the device and the group. A stand-in node with the same mode as a
// kvm-group /dev/kvm stands for it, since KVM may not be usable here.
func TestDeviceGroup(t *testing.T) {
	j := newTestJailer(t)
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	g, err := user.LookupGroup("disk")
	if err != nil {
		t.Skip("no disk group to stand in for kvm")
	}
	gid, _ := strconv.Atoi(g.Gid)
	// The node must be where devices work (not a nodev mount such as a
	// test's temporary directory may be) and reachable by the jail's uid.
	node := filepath.Join("/dev", "isopod-test-kvm-"+strconv.Itoa(os.Getpid()))
	t.Cleanup(func() { os.Remove(node) })
	if err := syscall.Mknod(node, syscall.S_IFCHR|0o660, int(1<<8|3)); err != nil { // same device as /dev/null
		t.Skipf("mknod: %v", err)
	}
	if err := os.Chown(node, 0, gid); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(node, 0o660); err != nil { // mknod's mode passed through the umask
		t.Fatal(err)
	}

	spec := sleeper(t)
	spec.Devices = []string{node}
	without := *j
	without.ids.groups = nil
	if _, err := startJailed(t, &without, spec); err == nil || !strings.Contains(err.Error(), node) || !strings.Contains(err.Error(), "group") {
		t.Errorf("without the group: %v; want a refusal naming %s and its group", err, node)
	}
	with := *j
	with.ids.groups = []int{gid}
	spec.Name += "-with"
	p, err := startJailed(t, &with, spec)
	if err != nil {
		t.Fatalf("with the group: %v", err)
	}
	if groups := statusField(t, p.Pid, "Groups"); groups != g.Gid {
		t.Errorf("groups %q; want only %s", groups, g.Gid)
	}
	time.Sleep(10 * time.Millisecond)
}
