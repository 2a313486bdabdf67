package mcpserver

import (
	"context"
	"io"
	"isopod/internal/hostio/hostiotest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/internal/hostio"
)

// copy_out onto a device or FIFO under the root, and copy_out and
// read_files naming a guest file that is missing or not a regular file,
// through the real core over the fake VMM (a guest file is a host file).

// runCopyOut calls sandbox_run with one copy_out.
func runCopyOut(t *testing.T, s *session, guest, host string) (text string, isErr bool) {
	t.Helper()
	res := s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": "true", "base": "base-min", "network": false, "cwd": "/",
		"copy_out": []map[string]string{{"guest": guest, "host": host}},
	}, nil)
	return resultText(res), res.IsError
}

func TestCopyOutOntoDeviceAndFIFO(t *testing.T) {
	core, drv := newFakeCore(t)
	root := t.TempDir()
	home := filepath.Join(t.TempDir(), "home")
	guest := filepath.Join(t.TempDir(), "guest.txt")
	hostiotest.MustWrite(t, guest, "made in the guest\n")

	t.Run("/dev/null, unconfined", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("replacing /dev/null, the failure this guards against, needs root")
		}
		s := connect(t, Config{Core: core, HostIO: hostio.Policy{Root: "/", Home: home, CopyOut: true}, NoStartupGC: true, GCEvery: -1})
		// First a private null device under the root: a copy that
		// replaced it must not reach the host's /dev/null.
		private := filepath.Join(root, "null")
		if err := syscall.Mknod(private, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Fatal(err)
		}
		for _, dest := range []string{private, "/dev/null"} {
			var before syscall.Stat_t
			if err := syscall.Lstat(dest, &before); err != nil {
				t.Fatal(err)
			}
			if text, isErr := runCopyOut(t, s, guest, dest); isErr {
				t.Fatalf("copy_out onto %s: %s", dest, text)
			}
			var after syscall.Stat_t
			if err := syscall.Lstat(dest, &after); err != nil || after.Mode != before.Mode || after.Ino != before.Ino || after.Rdev != before.Rdev {
				t.Fatalf("%s was replaced: mode %o, was %o (%v)", dest, after.Mode, before.Mode, err)
			}
		}
	})

	s := connect(t, Config{Core: core, HostIO: hostio.Policy{Root: root, Home: home, CopyOut: true}, NoStartupGC: true, GCEvery: -1})
	fifo := filepath.Join(root, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Run("a FIFO with a reader", func(t *testing.T) {
		fd, err := syscall.Open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		r := os.NewFile(uintptr(fd), fifo)
		defer r.Close()
		if text, isErr := runCopyOut(t, s, guest, "fifo"); isErr {
			t.Fatalf("copy_out onto a FIFO: %s", text)
		}
		syscall.SetNonblock(fd, false)
		if got, err := io.ReadAll(r); err != nil || string(got) != "made in the guest\n" {
			t.Errorf("the reader got %q, %v", got, err)
		}
	})
	t.Run("a FIFO without a reader", func(t *testing.T) {
		start := time.Now()
		text, isErr := runCopyOut(t, s, guest, "fifo")
		if !isErr || !strings.Contains(text, "failed (failed_precondition)") || !strings.Contains(text, "no program has open for reading") ||
			!strings.Contains(text, "needs its reader running") {
			t.Errorf("copy_out onto a FIFO without a reader: %s", text)
		}
		if d := time.Since(start); d > 20*time.Second {
			t.Errorf("the failure took %v", d)
		}
	})
	var st syscall.Stat_t
	if err := syscall.Lstat(fifo, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Errorf("the FIFO was replaced (mode %o, %v)", st.Mode, err)
	}
	if n := liveMachines(drv); n != 0 {
		t.Errorf("%d machines still run", n)
	}
}

// A guest path that names no file is not_found, one that names no regular
// file a refusal naming its type; neither is an internal failure, and
// read_files says so in its own words.
func TestCopyOutGuestMistakesClassed(t *testing.T) {
	core, _ := newFakeCore(t)
	root := t.TempDir()
	s := connect(t, Config{Core: core, HostIO: hostio.Policy{Root: root, Home: filepath.Join(t.TempDir(), "home"), CopyOut: true}, NoStartupGC: true, GCEvery: -1})
	dir := t.TempDir()
	missing, fifo := filepath.Join(dir, "missing"), filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, guest string
		readFiles   bool
		want        []string
	}{
		{"copy_out missing", missing, false, []string{"failed (not_found)", missing, "no such file or directory", "did not exist when it ended"}},
		{"read_files missing", missing, true, []string{"failed (not_found)", "read_files[0] " + missing, "no such file or directory", "did not exist when it ended"}},
		{"copy_out FIFO", fifo, false, []string{"refused", fifo, "is a FIFO, not a regular file"}},
		{"read_files FIFO", fifo, true, []string{"refused", "read_files[0] " + fifo, "is a FIFO, not a regular file"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := map[string]any{"cmd": "true", "base": "base-min", "network": false, "cwd": "/"}
			if tt.readFiles {
				args["read_files"] = []string{tt.guest}
			} else {
				args["copy_out"] = []map[string]string{{"guest": tt.guest, "host": "out"}}
			}
			res := s.call(t, context.Background(), ToolSandboxRun, args, nil)
			text := resultText(res)
			if !res.IsError || strings.Contains(text, "internal") || strings.Contains(text, "retry once") {
				t.Errorf("got %s; want a caller's mistake", text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("%s\ndoes not say %q", text, w)
				}
			}
		})
	}
}
