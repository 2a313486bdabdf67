//go:build linux

package jail

import (
	"context"
	"isopod/internal/testaccount"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// asUserEnv tells TestConfined that TestConfinedAsUser runs it as a user
// with a subordinate range, whose VMM must run as a subordinate id.
const asUserEnv = "ISOPOD_JAIL_TEST_AS_USER"

// testAccountPrefix names the users these tests make.
const testAccountPrefix = "isopodjt"

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
	a := testaccount.New(t, testAccountPrefix)
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
	if err := testaccount.CopyFile(self, bin, 0o755); err != nil {
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
	cmd := a.Command(ctx, []string{"HOME=" + home, asUserEnv + "=1"},
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
