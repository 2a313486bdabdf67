package jail

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/testaccount"
)

// accountPrefix names the users these tests make (testaccount.New adds
// the test binary's pid).
const accountPrefix = "isopodit"

// unprivilegedUserNamespaces says why a normal user cannot make user
// namespaces here (nil: it can).
func unprivilegedUserNamespaces() error {
	for name, forbids := range map[string]string{
		"user/max_user_namespaces":                     "0",
		"kernel/unprivileged_userns_clone":             "0",
		"kernel/apparmor_restrict_unprivileged_userns": "1",
	} {
		if b, err := os.ReadFile("/proc/sys/" + name); err == nil && strings.TrimSpace(string(b)) == forbids {
			return fmt.Errorf("%s is %s", strings.ReplaceAll(name, "/", "."), forbids)
		}
	}
	return nil
}

// userHome is a state root for a, in a directory of the test's own: the
// kernel and images the run needs from the test's private home (hard
// links, which stay root's and world-readable; copies where a link cannot
// be made), the scratch disk templates too where scratch is set (else
// the run makes its own, as a new user's first run does), and the
// binaries, where a can run them. It returns the root and the directory
// of the binaries.
func userHome(t *testing.T, a testaccount.Account, scratch bool) (home, bin string) {
	t.Helper()
	tmp, err := filepath.EvalSymlinks(os.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp(tmp, "isopod-jail-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		killVMMs(filepath.Join(dir, "home"))
		os.RemoveAll(dir)
		// The run's socket directory, per uid.
		os.RemoveAll(filepath.Join(tmp, "isopod-"+strconv.Itoa(a.UID)))
	})
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	home, bin = filepath.Join(dir, "home"), filepath.Join(dir, "bin")
	for _, d := range []string{home, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"isopod", "isopod-agent"} {
		if err := testaccount.CopyFile(filepath.Join(e2e.BinDir, name), filepath.Join(bin, name), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	own := func(p string) {
		if err := os.Lchown(p, a.UID, a.GID); err != nil {
			t.Fatal(err)
		}
	}
	link := func(src, dst string) {
		real, err := filepath.EvalSymlinks(src)
		if err != nil {
			t.Fatal(err)
		}
		fi, err := os.Stat(real)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&0o004 != 0 && os.Link(real, dst) == nil {
			return // never chown a link: it is the source's file
		}
		if err := testaccount.CopyFile(real, dst, 0o644); err != nil {
			t.Fatal(err)
		}
		own(dst)
	}
	kernels := filepath.Join(e2e.HomeDir, "kernels")
	err = filepath.WalkDir(kernels, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(kernels, p)
		dst := filepath.Join(home, "kernels", rel)
		if d.IsDir() {
			if err := os.Mkdir(dst, 0o755); err != nil {
				return err
			}
			own(dst)
			return nil
		}
		link(p, dst)
		return nil
	})
	if err != nil {
		t.Fatalf("linking the kernels: %v", err)
	}
	images := filepath.Join(home, "images")
	if err := os.Mkdir(images, 0o755); err != nil {
		t.Fatal(err)
	}
	own(images)
	for _, pattern := range []string{"base-min.*", "initramfs.*", "scratch-*.ext4"} {
		matches, _ := filepath.Glob(filepath.Join(e2e.HomeDir, "images", pattern))
		for _, m := range matches {
			if strings.HasSuffix(m, ".ext4") {
				if !scratch {
					continue
				}
				// A scratch template is large and sparse: link it or let
				// isopod make the user's own.
				if real, err := filepath.EvalSymlinks(m); err == nil {
					os.Link(real, filepath.Join(images, filepath.Base(m)))
				}
				continue
			}
			link(m, filepath.Join(images, filepath.Base(m)))
		}
	}
	// The accelerator probe, so that the run does not probe again.
	if err := testaccount.CopyFile(filepath.Join(e2e.HomeDir, "accel-probe.json"), filepath.Join(home, "accel-probe.json"), 0o600); err == nil {
		own(filepath.Join(home, "accel-probe.json"))
	}
	own(home)
	if err := os.Chmod(home, 0o700); err != nil {
		t.Fatal(err)
	}
	return home, bin
}

// vmmOf is the pid of the QEMU of VM id (its command line names it), or 0.
func vmmOf(id string) int {
	procs, _ := os.ReadDir("/proc")
	for _, e := range procs {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(cmdline, []byte("/")) && bytes.Contains(cmdline, []byte("qemu-system")) &&
			bytes.Contains(cmdline, []byte("\x00isopod-"+id+"\x00")) {
			return pid
		}
	}
	return 0
}

// killVMMs kills the QEMU of every VM recorded under home.
func killVMMs(home string) {
	ents, _ := os.ReadDir(filepath.Join(home, "vms"))
	for _, e := range ents {
		if pid := vmmOf(e.Name()); pid > 0 {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// statusFields reads /proc/PID/status.
func statusFields(t *testing.T, pid int) map[string]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// limits reads /proc/PID/limits: name -> soft and hard limit.
func limits(t *testing.T, pid int) map[string][2]string {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/limits")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][2]string{}
	for _, line := range strings.Split(string(b), "\n")[1:] {
		if len(line) < 26 {
			continue
		}
		if f := strings.Fields(line[26:]); len(f) >= 2 {
			out[strings.TrimSpace(line[:26])] = [2]string{f[0], f[1]}
		}
	}
	return out
}

// TestRootlessRun is the confinement suite for a normal user: a user the
// test makes, with a subordinate range, runs `isopod run` on a state root
// the test prepares (the kernel and images linked from the test's private
// home, readable by it). While the guest command runs, its VMM has QEMU's
// seccomp filter, no_new_privs and no capabilities, runs as the user's
// subordinate uid and gid (not the user's own), has namespaces of its own
// and a root that holds only QEMU's files; on cgroup v1 (no cgroup for a
// normal user) its memory and processes are capped with rlimits and the
// report says so. The run succeeds.
func TestRootlessRun(t *testing.T) {
	e2e.RequireVM(t)
	if err := unprivilegedUserNamespaces(); err != nil {
		t.Skipf("unprivileged user namespaces are not allowed here: %v", err)
	}
	a := testaccount.New(t, accountPrefix)
	home, bin := userHome(t, a, true)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := a.Command(ctx, []string{"HOME=" + home, "ISOPOD_HOME=" + home, "ISOPOD_AGENT_BIN=" + filepath.Join(bin, "isopod-agent"),
		"ISOPOD_WARM_POOL=off"},
		filepath.Join(bin, "isopod"), "run", "--timeout-s", "600", "--", "sh", "-c", "echo jail-test-ready; sleep 30; echo done")
	cmd.Dir = home
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() { waitErr = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		cancel()
		<-exited
	})

	// The VM, then its guest command running (its stdout is written live).
	var vm string
	deadline := time.Now().Add(8 * time.Minute)
	for {
		if vm == "" {
			if ents, _ := os.ReadDir(filepath.Join(home, "vms")); len(ents) == 1 {
				vm = ents[0].Name()
			}
		} else if b, _ := os.ReadFile(filepath.Join(home, "vms", vm, "stdout.log")); bytes.Contains(b, []byte("jail-test-ready")) {
			break
		}
		select {
		case <-exited:
			t.Fatalf("isopod ended before its command ran: %v\nstdout: %s\nstderr: %s", waitErr, out.Bytes(), errb.Bytes())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("the guest command did not start in 8 minutes (VM %q)\nstderr: %s", vm, errb.Bytes())
		}
	}
	pid := vmmOf(vm)
	if pid == 0 {
		t.Fatalf("no QEMU runs for %s", vm)
	}
	t.Logf("VM %s: VMM pid %d", vm, pid)

	st := statusFields(t, pid)
	for field, want := range map[string]string{"Seccomp": "2", "NoNewPrivs": "1", "CapEff": "0000000000000000",
		"CapPrm": "0000000000000000", "CapInh": "0000000000000000", "CapBnd": "0000000000000000", "CapAmb": "0000000000000000"} {
		if st[field] != want {
			t.Errorf("VMM %s: %q; want %s", field, st[field], want)
		}
	}
	// In the initial namespace, every uid and gid is the user's
	// subordinate one.
	for field, want := range map[string]int{"Uid": a.SubUID, "Gid": a.SubGID} {
		for _, id := range strings.Fields(st[field]) {
			if id != strconv.Itoa(want) {
				t.Errorf("VMM %s %q; want the subordinate %d (the user's own is %d/%d)", field, st[field], want, a.UID, a.GID)
				break
			}
		}
	}
	for _, ns := range []string{"user", "mnt", "pid", "net", "ipc", "uts"} {
		mine, _ := os.Readlink("/proc/self/ns/" + ns)
		theirs, err := os.Readlink("/proc/" + strconv.Itoa(pid) + "/ns/" + ns)
		if err != nil || theirs == mine {
			t.Errorf("VMM %s namespace %q is the host's %q (%v)", ns, theirs, mine, err)
		}
	}
	root := "/proc/" + strconv.Itoa(pid) + "/root"
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
		switch e.Name() {
		case "bin", "usr", "lib", "lib64", "etc", "dev", "proc":
		default:
			t.Errorf("the VMM's root holds %s", e.Name())
		}
	}
	t.Logf("the VMM's root: %v", names)
	for _, p := range []string{home, filepath.Dir(bin), "/tmp", "/root", "/home"} {
		if _, err := os.Stat(root + p); err == nil {
			t.Errorf("%s is visible in the VMM's root", p)
		}
	}
	if f, err := os.OpenFile(root+"/usr/isopod-jail-test", os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		f.Close()
		os.Remove(root + "/usr/isopod-jail-test")
		t.Error("the VMM's root is writable")
	}
	v1 := false
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); errors.Is(err, fs.ErrNotExist) {
		v1 = true
	}
	lim := limits(t, pid)
	t.Logf("VMM limits: address space %v, processes %v", lim["Max address space"], lim["Max processes"])
	if v1 {
		// No cgroup for a normal user on cgroup v1: rlimits instead.
		if l := lim["Max processes"]; l[0] != "512" || l[1] != "512" {
			t.Errorf("VMM RLIMIT_NPROC %v; want 512", l)
		}
		as, err := strconv.ParseInt(lim["Max address space"][0], 10, 64)
		if err != nil || as < 512<<20 || lim["Max address space"][1] != lim["Max address space"][0] {
			t.Errorf("VMM RLIMIT_AS %v; want a cap above guest RAM", lim["Max address space"])
		}
		if l := lim["Max core file size"]; l[0] != "0" {
			t.Errorf("VMM RLIMIT_CORE %v; want 0", l)
		}
	}

	select {
	case <-exited:
		if waitErr != nil {
			t.Fatalf("isopod run as %s: %v\nstdout: %s\nstderr: %s", a.Name, waitErr, out.Bytes(), errb.Bytes())
		}
	case <-ctx.Done():
		t.Fatalf("isopod run as %s did not end\nstderr: %s", a.Name, errb.Bytes())
	}
	var rep struct {
		OK       bool     `json:"ok"`
		ExitCode int      `json:"exit_code"`
		Stdout   string   `json:"stdout"`
		Warnings []string `json:"warnings"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, out.Bytes())
	}
	if !rep.OK || rep.ExitCode != 0 || rep.Stdout != "jail-test-ready\ndone\n" {
		t.Errorf("run as %s: %s", a.Name, out.Bytes())
	}
	warned := func(s string) bool {
		for _, w := range rep.Warnings {
			if strings.Contains(w, s) {
				return true
			}
		}
		return false
	}
	if v1 && !warned("capped with rlimits instead") {
		t.Errorf("cgroup v1: the report does not warn of the rlimit fallback: %q", rep.Warnings)
	}
	if warned("your own uid") || warned("unconfined") {
		t.Errorf("the report warns of a weaker jail: %q", rep.Warnings)
	}
}

// noVMs makes sure a command ran with no VM: no VM directory under
// home and no QEMU naming one.
func noVMs(t *testing.T, home string, before map[string]bool) {
	t.Helper()
	ents, _ := os.ReadDir(filepath.Join(home, "vms"))
	for _, e := range ents {
		if !before[e.Name()] {
			t.Errorf("a VM %s was made", e.Name())
			if pid := vmmOf(e.Name()); pid > 0 {
				t.Errorf("and its QEMU %d runs", pid)
			}
		}
	}
}

// vmsNow lists the VM directories under home.
func vmsNow(home string) map[string]bool {
	out := map[string]bool{}
	ents, _ := os.ReadDir(filepath.Join(home, "vms"))
	for _, e := range ents {
		out[e.Name()] = true
	}
	return out
}

// inUserNamespace runs isopod as root of a new user namespace (root mapped
// to itself, so that the test's private home stays its own) after script
// ran there, or in a namespace nested in that one, and returns its report.
func inUserNamespace(t *testing.T, script string, nested bool, args ...string) *e2e.Result {
	t.Helper()
	argv := []string{"--user", "--map-root-user", "--", "sh", "-c", script + ` && exec "$0" "$@"`}
	if nested {
		argv = append(argv, "unshare", "--user", "--map-root-user", "--")
	}
	argv = append(append(argv, filepath.Join(e2e.BinDir, "isopod")), args...)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", argv...)
	cmd.Env = append(os.Environ(), "ISOPOD_AGENT_BIN="+filepath.Join(e2e.BinDir, "isopod-agent"))
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := &e2e.Result{Stdout: out.Bytes(), Stderr: errb.Bytes()}
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		r.Code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("unshare: %v", err)
	}
	if err := json.Unmarshal(r.Stdout, &r.JSON); err != nil {
		t.Fatalf("isopod in a user namespace: stdout is not one JSON object: %v\n%s", err, r)
	}
	return r
}

// TestUserNamespacesDisabled: where user namespaces cannot be made, the
// run is refused before anything boots (no VM, no QEMU), with an error
// that names user namespaces, the setting and the fix. For real: isopod
// runs as root of a user namespace whose user.max_user_namespaces the
// test set (the limit is per namespace and binds what is made inside):
// to 0 there, which isopod reads; and to 1 in the namespace above, which
// isopod cannot read and its probe finds.
func TestUserNamespacesDisabled(t *testing.T) {
	e2e.RequireVM(t)
	if os.Geteuid() != 0 {
		t.Skip("setting a user namespace's limit the way this test does needs root")
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Skip("util-linux unshare is not installed")
	}
	if err := exec.Command("unshare", "--user", "--map-root-user", "--", "sh", "-c",
		"echo 0 > /proc/sys/user/max_user_namespaces").Run(); err != nil {
		t.Skipf("cannot set user.max_user_namespaces in a user namespace here: %v", err)
	}
	for _, tt := range []struct {
		name, script string
		nested       bool
		says, fix    string
	}{
		{"disabled here", "echo 0 > /proc/sys/user/max_user_namespaces", false,
			"user namespaces are disabled (user.max_user_namespaces = 0)", "sysctl -w user.max_user_namespaces="},
		// One namespace allowed above isopod's, and isopod's is it.
		{"limit reached above", "echo 1 > /proc/sys/user/max_user_namespaces", true,
			"cannot create a user namespace (no space left on device)", "sysctl -w user.max_user_namespaces="},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := vmsNow(e2e.HomeDir)
			r := inUserNamespace(t, tt.script, tt.nested, "run", "--no-network", "--", "true")
			msg := e2e.Str(r.JSON, "error")
			if r.Code != 1 || r.JSON["ok"] != false || e2e.Str(r.JSON, "class") != "failed_precondition" ||
				!strings.Contains(msg, "VMM jail") || !strings.Contains(msg, tt.says) || !strings.Contains(msg, tt.fix) ||
				!strings.Contains(msg, "ISOPOD_JAIL=off") {
				t.Errorf("want a refusal naming %q and the fix %q:\n%s", tt.says, tt.fix, r)
			}
			noVMs(t, e2e.HomeDir, before)
		})
	}
}
