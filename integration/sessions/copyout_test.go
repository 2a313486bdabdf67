package sessions

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/integration/e2e"
)

// A session's copies to the host follow run's copy-out rules: exec
// --copy-out copies after the command and lists what it wrote; a copy
// onto a FIFO or a character device is written through, the node kept; a
// copy over a regular file replaces it whole; --copy-out with --detach is
// refused before anything runs.
func TestSessionCopyOut(t *testing.T) {
	e2e.RequireVM(t)
	t.Parallel()
	id, _ := start(t, "--no-network")
	dir := t.TempDir()

	// exec --copy-out, over an older file.
	dst := filepath.Join(dir, "out.bin")
	if err := os.WriteFile(dst, []byte("old, longer than what replaces it"), 0o600); err != nil {
		t.Fatal(err)
	}
	r := isopod(t, "session", "exec", id, "--copy-out", "/tmp/out.bin:"+dst, "--", "sh", "-c", "printf 'new\\0bytes' > /tmp/out.bin")
	if got, _ := os.ReadFile(dst); !bytes.Equal(got, []byte("new\x00bytes")) {
		t.Errorf("exec --copy-out wrote %q", got)
	}
	cps, _ := r.JSON["copy_out"].([]any)
	if len(cps) != 1 || e2e.Num(t, cps[0].(map[string]any), "bytes") != 9 {
		t.Errorf("copy_out %v; want one copy of 9 bytes", r.JSON["copy_out"])
	}

	// A FIFO with a reader gets the bytes; the node stays a FIFO.
	fifo := filepath.Join(dir, "pipe")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	read := make(chan []byte, 1)
	go func() {
		f, err := os.Open(fifo)
		if err != nil {
			read <- nil
			return
		}
		defer f.Close()
		b, _ := io.ReadAll(f)
		read <- b
	}()
	isopod(t, "session", "cp", id+":/tmp/out.bin", fifo)
	if got := <-read; !bytes.Equal(got, []byte("new\x00bytes")) {
		t.Errorf("the FIFO's reader got %q", got)
	}
	if fi, err := os.Lstat(fifo); err != nil || fi.Mode()&os.ModeNamedPipe == 0 {
		t.Errorf("the FIFO is now %v, %v; want the FIFO kept", fi.Mode(), err)
	}

	// /dev/null stays the device.
	isopod(t, "session", "cp", id+":/tmp/out.bin", "/dev/null")
	if fi, err := os.Lstat("/dev/null"); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		t.Fatalf("/dev/null is now %v, %v", fi.Mode(), err)
	}

	if r := e2e.Isopod(t, cold, "session", "exec", id, "--detach", "--copy-out", "/tmp/out.bin:"+dst, "--", "true"); r.Code == 0 || e2e.Str(r.JSON, "class") != "invalid_argument" {
		t.Errorf("--copy-out with --detach: %s; want invalid_argument", r)
	}
}
