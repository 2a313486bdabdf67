package agent

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

// The image of a mounted ext4 copied while it is frozen mounts clean: no
// journal to replay, and what was written before the freeze is in it.
func TestFreezeFDCleanImage(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 {
		t.Skip("needs root and a loop-mounted ext4 (not -short)")
	}
	for _, tool := range []string{"mkfs.ext4", "mount", "umount", "dumpe2fs", "e2fsck", "debugfs"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s: %v", tool, err)
		}
	}
	run := func(name string, args ...string) string {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", name, args, err, out)
		}
		return string(out)
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "fs.ext4"), filepath.Join(dir, "mnt")
	if err := os.Mkdir(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	run("truncate", "-s", "64M", img)
	run("mkfs.ext4", "-q", "-F", img)
	run("mount", "-o", "loop", img, mnt)
	t.Cleanup(func() { exec.Command("umount", mnt).Run() })
	if err := os.WriteFile(filepath.Join(mnt, "f"), []byte("before the freeze\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	fd, err := unix.Open(mnt, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if err := freezeFD(fd); err != nil {
		t.Fatal(err)
	}
	if err := freezeFD(fd); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("a second freeze: %v; want failed_precondition", err)
	}
	cp := filepath.Join(dir, "copy.ext4")
	run("cp", "--sparse=always", img, cp)
	if err := thawFD(fd); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(mnt, "g"), []byte("after\n"), 0o644); err != nil {
		t.Fatalf("writing after the thaw: %v", err)
	}
	if feat := run("dumpe2fs", "-h", cp); strings.Contains(feat, "needs_recovery") {
		t.Errorf("the frozen copy needs a journal replay:\n%s", feat)
	}
	run("e2fsck", "-fn", cp)
	if got := run("debugfs", "-R", "cat /f", cp); !strings.Contains(got, "before the freeze") {
		t.Errorf("/f in the copy: %q", got)
	}
}
