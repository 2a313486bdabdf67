// Package testaccount makes throwaway normal users for tests that must run
// isopod (or its jail) as someone other than root: each with a subordinate
// uid and gid range, removed with the test, and named for the test binary's
// pid so that a leftover of a killed binary is swept by the next one.
package testaccount

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/hosttool"
)

// Account is a normal user a test made.
type Account struct {
	Name     string
	UID, GID int
	// SubUID and SubGID start its subordinate ranges.
	SubUID, SubGID int
}

// tools are what making, using and removing an account needs.
var tools = []string{"useradd", "userdel", "usermod", "setpriv", "unshare", "newuidmap", "newgidmap"}

// UserPATH is the PATH a normal user's login gets on Debian and its kin:
// no sbin directory, where e2fsprogs and others put their programs.
// Command runs everything with it, as a new user would.
const UserPATH = "/usr/local/bin:/usr/bin:/bin"

// tool is the path of the program name (hosttool.Find), or name itself.
func tool(name string) string {
	if p, err := hosttool.Find(name); err == nil {
		return p
	}
	return name
}

// New makes a normal user named prefix and the test binary's pid, with a
// subordinate uid and gid range (useradd gives one where /etc/login.defs
// says so; otherwise New adds one), and removes it, ranges included, when
// the test ends. It first removes the accounts of prefix that binaries no
// longer running left. It skips unless the test runs as root with the
// shadow, util-linux and uidmap tools.
func New(t *testing.T, prefix string) Account {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making a test user needs root")
	}
	for _, name := range tools {
		if _, err := hosttool.Find(name); err != nil {
			t.Skipf("%v (shadow-utils, util-linux and uidmap are needed)", err)
		}
	}
	sweep(t, prefix)
	name := prefix + strconv.Itoa(os.Getpid())
	if out, err := exec.Command(tool("useradd"), "--no-create-home", "--home-dir", "/nonexistent",
		"--shell", "/usr/sbin/nologin", "--user-group", name).CombinedOutput(); err != nil {
		t.Fatalf("useradd %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command(tool("userdel"), name).CombinedOutput(); err != nil {
			t.Errorf("userdel %s: %v: %s", name, err, out)
		}
		for _, f := range []string{"/etc/subuid", "/etc/subgid"} {
			if _, ok := subordinate(f, name); ok {
				t.Errorf("%s still grants the removed user %s a range", f, name)
			}
		}
	})
	u, err := user.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	a := Account{Name: name}
	a.UID, _ = strconv.Atoi(u.Uid)
	a.GID, _ = strconv.Atoi(u.Gid)
	var uok, gok bool
	a.SubUID, uok = subordinate("/etc/subuid", name)
	a.SubGID, gok = subordinate("/etc/subgid", name)
	if !uok || !gok {
		start := freeSubordinateStart()
		r := fmt.Sprintf("%d-%d", start, start+65535)
		if out, err := exec.Command(tool("usermod"), "--add-subuids", r, "--add-subgids", r, name).CombinedOutput(); err != nil {
			t.Fatalf("usermod --add-subuids %s %s: %v: %s", r, name, err, out)
		}
		a.SubUID, a.SubGID = start, start
	}
	return a
}

// Command runs argv as a, through setpriv, with only env and UserPATH in
// its environment (env may set another PATH).
func (a Account) Command(ctx context.Context, env []string, argv ...string) *exec.Cmd {
	args := append([]string{"--reuid=" + strconv.Itoa(a.UID), "--regid=" + strconv.Itoa(a.GID), "--init-groups", "--"}, argv...)
	cmd := exec.CommandContext(ctx, tool("setpriv"), args...)
	cmd.Env = append([]string{"PATH=" + UserPATH}, env...)
	cmd.WaitDelay = 10 * time.Second
	return cmd
}

// subordinate is the start of the first range that the subuid or subgid
// file at path grants name.
func subordinate(path, name string) (int, bool) {
	f, err := os.Open(path)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(strings.TrimSpace(sc.Text()), ":")
		if len(fields) == 3 && fields[0] == name {
			if start, err := strconv.Atoi(fields[1]); err == nil && start > 0 {
				return start, true
			}
		}
	}
	return 0, false
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

// sweep removes the users of prefix that test binaries killed before
// their cleanup left: named for a pid that no longer runs (userdel refuses
// a user that still has processes).
func sweep(t *testing.T, prefix string) {
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		name, _, _ := strings.Cut(sc.Text(), ":")
		pid, err := strconv.Atoi(strings.TrimPrefix(name, prefix))
		if !strings.HasPrefix(name, prefix) || err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		if out, err := exec.Command(tool("userdel"), name).CombinedOutput(); err != nil {
			t.Logf("removing the leftover test user %s: %v: %s", name, err, out)
		}
	}
}

// CopyFile copies src to a new file dst with mode: how a test puts a
// binary where its account can run it.
func CopyFile(src, dst string, mode os.FileMode) error {
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
