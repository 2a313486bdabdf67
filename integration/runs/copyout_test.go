package runs

import (
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"isopod/integration/e2e"
	"isopod/internal/agentproto"
)

// --copy-out onto a character device or a FIFO writes through to it; the
// node stays what it was.
func TestRunCopyOutOntoDeviceAndFIFO(t *testing.T) {
	e2e.RequireVM(t)
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Open(fifo, syscall.O_RDONLY|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	reader := os.NewFile(uintptr(fd), fifo)
	defer reader.Close()
	// A null device node of the test's own first: a copy-out that
	// replaced it must not reach the host's /dev/null.
	private := filepath.Join(dir, "null")
	if os.Geteuid() == 0 {
		if err := syscall.Mknod(private, syscall.S_IFCHR|0o666, 1<<8|3); err != nil {
			t.Fatal(err)
		}
	} else {
		private = "/dev/null" // only root could replace it
	}
	nodes := map[string]syscall.Stat_t{}
	for _, p := range []string{private, "/dev/null"} {
		var st syscall.Stat_t
		if err := syscall.Lstat(p, &st); err != nil {
			t.Fatal(err)
		}
		nodes[p] = st
	}
	unchanged := func(p string) {
		t.Helper()
		var st syscall.Stat_t
		was := nodes[p]
		if err := syscall.Lstat(p, &st); err != nil || st.Mode != was.Mode || st.Ino != was.Ino || st.Rdev != was.Rdev {
			t.Fatalf("%s was replaced: mode %o, was %o (%v)", p, st.Mode, was.Mode, err)
		}
	}
	r := e2e.Run(t, "--no-network", "--copy-out", "/root/out.txt:"+fifo, "--copy-out", "/root/out.txt:"+private, "--",
		"sh", "-c", "echo made in the guest > /root/out.txt")
	if copied, _ := r.JSON["copied"].([]any); len(copied) != 2 {
		t.Errorf("copied: %v", r.JSON["copied"])
	}
	syscall.SetNonblock(fd, false)
	if got, err := io.ReadAll(reader); err != nil || string(got) != "made in the guest\n" {
		t.Errorf("the FIFO's reader got %q, %v", got, err)
	}
	unchanged(private)
	if private != "/dev/null" {
		e2e.Run(t, "--no-network", "--copy-out", "/etc/hostname:/dev/null", "--", "true")
		unchanged("/dev/null")
	}
	reader.Close()

	// No reader now: the copy fails at once, and says why.
	start := time.Now()
	f := e2e.RunFail(t, nil, "no program has open for reading", "run", "--no-network", "--copy-out", "/etc/hostname:"+fifo, "--", "true")
	if c := e2e.Str(f.JSON, "class"); c != "failed_precondition" {
		t.Errorf("class %q; want failed_precondition", c)
	}
	if d := time.Since(start); d > 2*time.Minute {
		t.Errorf("the failure took %v", d)
	}
	var st syscall.Stat_t
	if err := syscall.Lstat(fifo, &st); err != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
		t.Errorf("the FIFO was replaced (mode %o, %v)", st.Mode, err)
	}
}

// A guest file that is missing, or no regular file, is the caller's
// mistake, of its class, naming the guest path.
func TestRunCopyOutGuestMistakes(t *testing.T) {
	e2e.RequireVM(t)
	dest := filepath.Join(t.TempDir(), "out")
	f := e2e.RunFail(t, nil, "/root/missing: no such file or directory", "run", "--no-network", "--copy-out", "/root/missing:"+dest, "--", "true")
	if c := e2e.Str(f.JSON, "class"); c != "not_found" {
		t.Errorf("missing guest file: class %q; want not_found", c)
	}
	f = e2e.RunFail(t, nil, "/root/fifo: is a FIFO, not a regular file", "run", "--no-network", "--copy-out", "/root/fifo:"+dest, "--", "mkfifo", "/root/fifo")
	if c := e2e.Str(f.JSON, "class"); c != "invalid_argument" {
		t.Errorf("guest FIFO: class %q; want invalid_argument", c)
	}
	if _, err := os.Lstat(dest); err == nil {
		t.Errorf("a failed copy-out left %s", dest)
	}
}

// What the guest protocol cannot carry, and a destination that cannot be
// written, are refused before any VM starts.
func TestRunOverLimitsFailBeforeBoot(t *testing.T) {
	e2e.RequireVM(t)
	dir := t.TempDir()
	sock := filepath.Join(dir, "sock")
	if err := syscall.Mknod(sock, syscall.S_IFSOCK|0o600, 0); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", agentproto.MaxHeader)
	longPath := "/" + strings.Repeat("p", agentproto.MaxPath)
	limit := strconv.Itoa(agentproto.MaxRequestStrings)
	cases := []struct {
		want string
		args []string
	}{
		{"--env BIG: ", []string{"--env", "BIG=" + big, "--", "true"}},
		{limit, []string{"--env", "BIG=" + big, "--", "true"}},
		{"the command (after --): ", []string{"--", "echo", big}},
		{"--cwd: ", []string{"--cwd", longPath, "--", "true"}},
		{"--copy-out: ", []string{"--copy-out", longPath + ":" + filepath.Join(dir, "x"), "--", "true"}},
		{"is a socket", []string{"--copy-out", "/etc/hostname:" + sock, "--", "true"}},
		{"not a directory", []string{"--copy-out", "/etc/hostname:" + filepath.Join(sock, "x"), "--", "true"}},
	}
	before := vmCount(t)
	for _, c := range cases {
		start := time.Now()
		f := e2e.RunFail(t, nil, c.want, append([]string{"run", "--no-network"}, c.args...)...)
		if cl := e2e.Str(f.JSON, "class"); cl != "invalid_argument" {
			t.Errorf("%.60v: class %q; want invalid_argument", c.args, cl)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("%.60v: refusal took %v; it must come before any VM starts", c.args, d)
		}
	}
	if after := vmCount(t); after != before {
		t.Errorf("refused runs created %d VM records", after-before)
	}
}
