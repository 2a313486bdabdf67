//go:build linux

package jail

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// asUserEnv tells TestConfined that TestConfinedAsUser runs it as a user
// with a subordinate range, whose VMM must run as a subordinate id.
const asUserEnv = "ISOPOD_JAIL_TEST_AS_USER"

// testAccountPrefix names the users tests make; the test binary's pid
// follows, so that a leftover of a killed binary can be told apart.
const testAccountPrefix = "isopodjt"

// testAccount is a user a test made, with a subordinate range.
type testAccount struct {
	Name     string
	UID, GID int
}

// newTestAccount makes a normal user with a subordinate uid and gid range
// (useradd gives one where /etc/login.defs says so; otherwise the test adds
// one) and removes it, and its ranges, when the test ends. It skips
// unless the test runs as root with the shadow and uidmap tools.
func newTestAccount(t *testing.T) testAccount {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a test user needs root")
	}
	for _, tool := range []string{"useradd", "userdel", "usermod", "setpriv", "unshare", "newuidmap", "newgidmap"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s is not installed (shadow-utils, util-linux and uidmap are needed)", tool)
		}
	}
	sweepTestAccounts(t)
	name := testAccountPrefix + strconv.Itoa(os.Getpid())
	if out, err := exec.Command("useradd", "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
		for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
			if _, err := subordinate(f, name, -1); err == nil {
				t.Errorf("%s still grants the removed user %s a range", f, name)
			}
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	a := testAccount{Name: name}
	a.UID, _ = strconv.Atoi(u.Uid)
	a.GID, _ = strconv.Atoi(u.Gid)
	_, uerr := subordinate("/etc/subuid", name, a.UID)
	_, gerr := subordinate("/etc/subgid", name, a.UID)
	if uerr != nil || gerr != nil {
		start := freeSubordinateStart()
		r := fmt.Sprintf("%d-%d", start, start+65535)
		if out, err := exec.Command("usermod", "--add-subuids", r, "--add-subgids", r, name).CombinedOutput(); err != nil {
			t.Fatalf("usermod --add-subuids %s %s: %v: %s", r, name, err, out)
		}
	}
	return a
}

// freeSubordinateStart is the first id, on a 65536 boundary at or above
// 100000, after every range /etc/subuid and /etc/subgid grant.
func freeSubordinateStart() int {
	end := 100000
	for _, path := range []string{"/etc/subuid", "/etc/subgid"} {
		f, err := os.Open(path)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
			if len(fields) != 3 {
				continue
			}
			start, err1 := strconv.Atoi(fields[1])
			count, err2 := strconv.Atoi(fields[2])
			if err1 == nil && err2 == nil && start+count > end {
				end = start + count
			}
		}
		f.Close()
	}
	return (end + 65535) / 65536 * 65536
}

// sweepTestAccounts removes the users that test binaries killed before
// their cleanup left: named for a pid that no longer runs, and without
// processes (userdel refuses a user that has some).
func sweepTestAccounts(t *testing.T) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), ":")
		pid, err := strconv.Atoi(strings.TrimPrefix(name, testAccountPrefix))
		if !strings.HasPrefix(name, testAccountPrefix) || err != nil || pid == os.Getpid() {
			continue
		}
		if syscall.Kill(pid, 0) == nil {
			continue // its test binary still runs
		}
		if out, err := exec.Command("userdel", name).CombinedOutput(); err != nil {
			t.Logf("removing the leftover test user %s: %v: %s", name, err, out)
		}
	}
}

// asAccount is a command that runs argv as a, through setpriv, with only
// env (and PATH) in its environment.
func asAccount(ctx context.Context, a testAccount, env []string, argv ...string) *exec.Cmd {
	args := append([]string{"--reuid=" + strconv.Itoa(a.UID), "--regid=" + strconv.Itoa(a.GID), "--init-groups", "--"}, argv...)
	cmd := exec.CommandContext(ctx, "setpriv", args...)
	cmd.Env = append([]string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}, env...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// TestConfinedAsUser runs TestConfined as a normal user that the test
// makes, with a subordinate range: the jail maps the VMM to a subordinate
// id through util-linux unshare, and every check of TestConfined holds
// (namespaces, root, capabilities, no_new_privs), with the uid and gid
// subordinate ones. On cgroup v1 a normal user has no cgroup, so it
// expects the rlimit fallback, its warning and the limits.
func TestConfinedAsUser(t *testing.T) {
	if testing.Short() {
		t.Skip("starts confined processes as another user; skipped under -short")
	}
	if err := checkUserNamespaces("/proc/sys", 1000, apparmorLabel()); err != nil {
		t.Skipf("unprivileged user namespaces are not allowed here: %v", err)
	}
	a := newTestAccount(t)
	// The test binary, where the user can run it, and a home of its own.
	dir, err := os.MkdirTemp("", "isopod-jail-as-user-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "jail.test")
	if err := copyFile(self, bin, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, a.UID, a.GID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := asAccount(ctx, a, []string{"HOME=" + home, asUserEnv + "=1"},
		bin, "-test.run=^TestConfined$", "-test.v", "-test.count=1")
	cmd.Dir = home
	out, err := cmd.CombinedOutput()
	t.Logf("TestConfined as %s (uid %d):\n%s", a.Name, a.UID, out)
	if err != nil {
		t.Fatalf("TestConfined as %s: %v", a.Name, err)
	}
	if !strings.Contains(string(out), "--- PASS: TestConfined ") {
		t.Fatalf("TestConfined did not pass as %s", a.Name)
	}
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err != nil && !strings.Contains(string(out), "capped with rlimits instead") {
		t.Errorf("cgroup v1: want the rlimit fallback and its warning")
	}
}

func copyFile(src, dst string, mode os.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
