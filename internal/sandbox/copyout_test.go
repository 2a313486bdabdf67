package sandbox_test

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// Copy-out onto a character device or a FIFO writes through to it and
// leaves the node as it was; the fake guest's files are the host's.

// guestFile writes a file of size bytes holding head at its start and tail
// at its end, zeros (a hole) between.
func guestFile(t *testing.T, size int64, head, tail string) (string, []byte) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "guest.bin")
	want := make([]byte, size)
	copy(want, head)
	copy(want[size-int64(len(tail)):], tail)
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(head), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(tail), size-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
	return p, want
}

// sameNode fails unless path is still the node before describes.
func sameNode(t *testing.T, path string, before unix.Stat_t) {
	t.Helper()
	var after unix.Stat_t
	if err := unix.Lstat(path, &after); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if after.Mode != before.Mode || after.Ino != before.Ino || after.Rdev != before.Rdev {
		t.Errorf("%s was replaced: mode %o inode %d rdev %d; was mode %o inode %d rdev %d",
			path, after.Mode, after.Ino, after.Rdev, before.Mode, before.Ino, before.Rdev)
	}
}

func lstat(t *testing.T, path string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(path, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// noStaging fails if a staging file is left in dir.
func noStaging(t *testing.T, dir string) {
	t.Helper()
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".part") && strings.Contains(e.Name(), ".isopod-") {
			t.Errorf("staging file left in %s: %s", dir, e.Name())
		}
	}
}

func TestCopyOutOntoCharDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a device node and replacing one need root")
	}
	t.Parallel()
	s, _ := newColdService(t, vmmfake.Config{})
	guest, _ := guestFile(t, 300<<10, "head", "tail")
	copyTo := func(t *testing.T, dest string) {
		t.Helper()
		before := lstat(t, dest)
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CopyOut: []sandbox.CopyOut{{Guest: guest, Host: dest}}})
		if len(rep.Copied) != 1 || rep.Copied[0].Bytes != 300<<10 {
			t.Errorf("copied %+v; want the whole file", rep.Copied)
		}
		sameNode(t, dest, before)
		noStaging(t, filepath.Dir(dest))
	}
	// A node of the null device of its own first: a copy-out that
	// replaced it must not reach the host's /dev/null.
	private := filepath.Join(t.TempDir(), "null")
	if err := unix.Mknod(private, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	t.Run("private", func(t *testing.T) { copyTo(t, private) })
	if st := lstat(t, private); st.Mode&unix.S_IFMT != unix.S_IFCHR {
		t.Fatal("the private device node was replaced; not trying /dev/null")
	}
	t.Run("/dev/null", func(t *testing.T) { copyTo(t, "/dev/null") })
}

func TestCopyOutOntoFIFO(t *testing.T) {
	t.Parallel()
	s, _ := newColdService(t, vmmfake.Config{})
	// Larger than a chunk, with a hole of more than one chunk between
	// its ends: the hole reaches the reader as zeros.
	guest, want := guestFile(t, 200<<10, "head", "tail")
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	before := lstat(t, fifo)

	t.Run("with a reader", func(t *testing.T) {
		fd, err := unix.Open(fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := os.NewFile(uintptr(fd), fifo)
		defer r.Close()
		// Room for the whole file, so the reader reads it after the run.
		if _, err := unix.FcntlInt(r.Fd(), unix.F_SETPIPE_SZ, 1<<20); err != nil {
			t.Fatal(err)
		}
		rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CopyOut: []sandbox.CopyOut{{Guest: guest, Host: fifo}}})
		if len(rep.Copied) != 1 || rep.Copied[0].Bytes != int64(len(want)) {
			t.Errorf("copied %+v; want the whole file", rep.Copied)
		}
		unix.SetNonblock(fd, false)
		got, err := io.ReadAll(r)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("the reader got %d bytes (%v); want the %d of the file, its hole as zeros", len(got), err, len(want))
		}
		sameNode(t, fifo, before)
		noStaging(t, filepath.Dir(fifo))
	})

	t.Run("without a reader", func(t *testing.T) {
		start := time.Now()
		_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CopyOut: []sandbox.CopyOut{{Guest: guest, Host: fifo}}})
		var coe *machine.CopyOutError
		if !errors.Is(err, errdefs.ErrFailedPrecondition) || !errors.As(err, &coe) || !strings.Contains(err.Error(), "no program has open for reading") {
			t.Errorf("Run: %v; want a failed precondition saying the FIFO has no reader", err)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("the refusal took %v", d)
		}
		sameNode(t, fifo, before)
		noStaging(t, filepath.Dir(fifo))
	})
}

// A block device or a socket at the destination is refused before any VM
// starts.
func TestCopyOutRefusesBlockDeviceAndSocket(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	dir := t.TempDir()
	sock := filepath.Join(dir, "sock")
	if err := unix.Mknod(sock, unix.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	cases := map[string]string{sock: "is a socket"}
	if os.Geteuid() == 0 {
		// A node of a loop device; nothing is ever opened through it.
		blk := filepath.Join(dir, "blk")
		if err := unix.Mknod(blk, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 250))); err != nil {
			t.Fatal(err)
		}
		cases[blk] = "is a block device"
	}
	for dest, want := range cases {
		before := lstat(t, dest)
		_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CopyOut: []sandbox.CopyOut{{Guest: "/etc/hostname", Host: dest}}})
		if !errors.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), want) {
			t.Errorf("copy-out onto %s: %v; want invalid_argument saying it %s", dest, err, want)
		}
		sameNode(t, dest, before)
	}
	if n := len(d.Machines()); n != 0 {
		t.Errorf("%d machines started for refused runs", n)
	}
}

// A guest path that names no file, or no regular file, is the caller's
// mistake, of its class, not a failure of isopod.
func TestCopyOutGuestMistakes(t *testing.T) {
	t.Parallel()
	s, _ := newColdService(t, vmmfake.Config{})
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, guest string
		class       error
		want        string
	}{
		{"missing", filepath.Join(dir, "nope"), errdefs.ErrNotFound, "no such file or directory"},
		{"a FIFO", fifo, errdefs.ErrInvalidArgument, "is a FIFO, not a regular file"},
		{"a directory", dir, errdefs.ErrInvalidArgument, "is a directory, not a regular file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			host := filepath.Join(t.TempDir(), "out")
			_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CopyOut: []sandbox.CopyOut{{Guest: tt.guest, Host: host}}})
			var coe *machine.CopyOutError
			if !errors.Is(err, tt.class) || !errors.As(err, &coe) || coe.Guest != tt.guest ||
				!strings.Contains(err.Error(), tt.guest) || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Run: %v (class %s); want %v naming %s and saying %q", err, errdefs.Class(err), tt.class, tt.guest, tt.want)
			}
			if _, err := os.Lstat(host); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a failed copy-out left %s (%v)", host, err)
			}
		})
	}
}
