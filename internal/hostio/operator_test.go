package hostio

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"isopod/internal/errdefs"
)

// A destination that cannot be written is the caller's mistake, said
// before any VM starts.
func TestOperatorCheckCopyOut(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	fifo := filepath.Join(dir, "fifo")
	sock := filepath.Join(dir, "sock")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mknod(sock, syscall.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, dest string
		want       string // "" accepted
	}{
		{"new", filepath.Join(dir, "new"), ""},
		{"a regular file", file, ""},
		{"a character device", "/dev/null", ""},
		{"a FIFO", fifo, ""},
		{"a socket", sock, "is a socket"},
		{"a file as a directory", filepath.Join(file, "x"), "not a directory"},
		{"a name too long", filepath.Join(dir, strings.Repeat("n", 300)), "file name too long"},
		{"a missing directory", filepath.Join(dir, "no", "x"), "does not exist"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := Operator{}.CheckCopyOut("copy-out", tt.dest)
			switch {
			case tt.want == "" && err != nil:
				t.Errorf("CheckCopyOut(%s): %v", tt.dest, err)
			case tt.want != "" && (!errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("CheckCopyOut(%s): %v; want invalid_argument saying %q", tt.dest, err, tt.want)
			}
		})
	}
}

// A directory the caller cannot write is refused before any VM starts,
// not found out when the copy is staged. Root writes anywhere, so the
// check runs in a child as nobody.
func TestOperatorCheckCopyOutNotWritable(t *testing.T) {
	if dest := os.Getenv("ISOPOD_TEST_UNWRITABLE"); dest != "" {
		err := Operator{}.CheckCopyOut("copy-out", dest)
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "cannot write") {
			t.Fatalf("CheckCopyOut(%s): %v; want invalid_argument saying it cannot write", dest, err)
		}
		return
	}
	base, err := os.MkdirTemp("", "isopod-unwritable-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(base) })
	ro := filepath.Join(base, "ro")
	if err := os.Mkdir(ro, 0o555); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	// The test binary, where nobody can reach it.
	bin := filepath.Join(base, "hostio.test")
	if err := os.Link(os.Args[0], bin); err != nil {
		t.Skipf("cannot link the test binary for a child (%v)", err)
	}
	cmd := exec.Command(bin, "-test.run=^TestOperatorCheckCopyOutNotWritable$", "-test.count=1")
	cmd.Env = append(os.Environ(), "ISOPOD_TEST_UNWRITABLE="+filepath.Join(ro, "out"))
	if os.Geteuid() == 0 {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("%v\n%s", err, out)
	}
}
