package machine_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/vmm/vmmfake"
)

var noLimit = agentclient.CopyLimits{MaxData: agentclient.NoLimit}

// TestGetFileStaged: a guest file reaches a host path whole, with its
// mode masked, and the staging path is told before and cleared after; a
// missing guest file is not found and leaves the destination and its
// directory as they were.
func TestGetFileStaged(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := filepath.Join(t.TempDir(), "src")
	want := bytes.Repeat([]byte("isopod\n"), 50000)
	if err := os.WriteFile(src, want, 0o640); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	dest := filepath.Join(dir, "out")
	var told []string
	g := machine.GetFile{Guest: src, Host: dest, Staging: func(p string) { told = append(told, p) }}
	fd, err := m.GetFile(ctx, g, noLimit)
	if err != nil {
		t.Fatalf("GetFile: %v", err)
	}
	got, _ := os.ReadFile(dest)
	st, _ := os.Stat(dest)
	if !bytes.Equal(got, want) || fd.Bytes != int64(len(want)) || st.Mode().Perm() != 0o640 {
		t.Errorf("copied %d bytes (reported %d), mode %v; want %d bytes, mode 0640", len(got), fd.Bytes, st.Mode().Perm(), len(want))
	}
	if len(told) != 2 || filepath.Dir(told[0]) != dir || !machine.IsStagingName(filepath.Base(told[0]), os.Getpid()) || told[1] != "" {
		t.Errorf("staging told %q; want the staging path in %s, then \"\"", told, dir)
	}

	os.WriteFile(dest, []byte("kept"), 0o644)
	told = nil
	_, err = m.GetFile(ctx, machine.GetFile{Guest: src + ".missing", Host: dest, Staging: g.Staging}, noLimit)
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("missing guest file: %v; want not found", err)
	}
	if b, _ := os.ReadFile(dest); string(b) != "kept" {
		t.Errorf("a failed copy changed the destination: %q", b)
	}
	if len(told) != 2 || told[1] != "" {
		t.Errorf("staging told %q on failure; want a path, then \"\"", told)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("directory holds %d entries after a failed copy; want the destination alone", len(ents))
	}

	_, err = m.GetFile(ctx, machine.GetFile{Guest: src, Host: filepath.Join(dir, "no", "such")}, noLimit)
	if err == nil {
		t.Errorf("GetFile into a missing directory succeeded")
	}
}

// TestGetFileThroughFIFO: a FIFO at the destination is written straight
// through to its reader, and stays a FIFO; one without a reader fails at
// once as a failed precondition.
func TestGetFileThroughFIFO(t *testing.T) {
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := filepath.Join(t.TempDir(), "src")
	want := []byte(strings.Repeat("through the pipe\n", 1000))
	os.WriteFile(src, want, 0o644)
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := m.GetFile(ctx, machine.GetFile{Guest: src, Host: fifo}, noLimit); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("FIFO without a reader: %v; want a failed precondition", err)
	}

	r, err := os.OpenFile(fifo, os.O_RDONLY|unix.O_NONBLOCK, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	read := make(chan []byte, 1)
	go func() {
		unix.SetNonblock(int(r.Fd()), false)
		b, _ := io.ReadAll(r)
		read <- b
	}()
	// Keep a writer open only for the copy: ReadAll ends at the copy's close.
	if _, err := m.GetFile(ctx, machine.GetFile{Guest: src, Host: fifo}, noLimit); err != nil {
		t.Fatalf("GetFile into a FIFO: %v", err)
	}
	select {
	case got := <-read:
		if !bytes.Equal(got, want) {
			t.Errorf("reader got %d bytes; want %d", len(got), len(want))
		}
	case <-ctx.Done():
		t.Fatal("the FIFO's reader never saw the end of the copy")
	}
	if st, err := os.Lstat(fifo); err != nil || st.Mode().Type() != os.ModeNamedPipe {
		t.Errorf("destination after the copy: %v %v; want the FIFO still there", st, err)
	}
}

// TestGetFileThroughDevice: a character device at the destination (a
// private null device) is written through, holes as zeros, and is
// neither replaced nor changed in mode.
func TestGetFileThroughDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	m, _ := bootFake(t, vmmfake.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	src := filepath.Join(t.TempDir(), "sparse")
	f, _ := os.Create(src)
	f.WriteAt([]byte("end"), 3<<20)
	f.Close()
	null := filepath.Join(t.TempDir(), "null")
	if err := unix.Mknod(null, unix.S_IFCHR|0o600, int(unix.Mkdev(1, 3))); err != nil {
		t.Skipf("mknod: %v", err)
	}
	fd, err := m.GetFile(ctx, machine.GetFile{Guest: src, Host: null}, noLimit)
	if err != nil || fd.Bytes != 3<<20+3 {
		t.Fatalf("GetFile into a device: %+v %v", fd, err)
	}
	st, err := os.Lstat(null)
	if err != nil || st.Mode().Type() != os.ModeDevice|os.ModeCharDevice || st.Mode().Perm() != 0o600 {
		t.Errorf("device after the copy: %v %v; want the same character device, mode 0600", st.Mode(), err)
	}
}

// TestStageRefusesBlockDevice: a block device at the destination is
// neither staged over nor written.
func TestStageRefusesBlockDevice(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("making a device node needs root")
	}
	blk := filepath.Join(t.TempDir(), "blk")
	if err := unix.Mknod(blk, unix.S_IFBLK|0o600, int(unix.Mkdev(7, 200))); err != nil {
		t.Skipf("mknod: %v", err)
	}
	d, err := machine.Stage(context.Background(), machine.GetFile{Host: blk})
	if err == nil {
		d.Abort()
		t.Fatal("Stage over a block device succeeded")
	}
	if st, _ := os.Lstat(blk); st.Mode().Type()&os.ModeCharDevice != 0 || st.Mode().Type()&os.ModeDevice == 0 {
		t.Errorf("block device replaced: %v", st.Mode())
	}
}
