package agent

import (
	"bytes"
	"crypto/rand"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// memFile is an in-memory io.WriterAt that records the size of every
// write (one per chunk).
type memFile struct {
	b     []byte
	sizes []int
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if end := off + int64(len(p)); end > int64(len(f.b)) {
		f.b = append(f.b, make([]byte, end-int64(len(f.b)))...)
	}
	f.sizes = append(f.sizes, len(p))
	return copy(f.b[off:], p), nil
}

// copyOut runs one copy-out with the client.
func (c *testConn) copyOut(path string, lim agentclient.CopyLimits) (*memFile, *agentproto.FileDone, error) {
	w := &memFile{}
	fd, err := c.CopyOut(c.ctx(), path, lim, w)
	return w, fd, err
}

func TestCopyOut(t *testing.T) {
	c := startAgent(t, Options{})
	dir := t.TempDir()
	big := make([]byte, 5<<20)
	rand.Read(big)
	bigPath := filepath.Join(dir, "big")
	if err := os.WriteFile(bigPath, big, 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(bigPath, 0o640)
	got, done, err := c.copyOut(bigPath, agentclient.CopyLimits{MaxSize: 6 << 20, MaxData: agentclient.NoLimit})
	if err != nil {
		t.Fatalf("copy-out: %v", err)
	}
	if !bytes.Equal(got.b, big) || done.Bytes != int64(len(big)) || done.Mode != 0o640 {
		t.Errorf("got %d bytes, done %+v; want %d identical bytes and mode 0640", len(got.b), done, len(big))
	}
	for _, n := range got.sizes {
		if n == 0 || n > agentproto.ChunkSize {
			t.Fatalf("a file chunk of %d bytes; want 1..%d", n, agentproto.ChunkSize)
		}
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	if got, done, err := c.copyOut(empty, agentclient.CopyLimits{}); err != nil || len(got.b) != 0 || done.Bytes != 0 {
		t.Errorf("empty file: %+v, %v", done, err)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	noLimit := agentclient.CopyLimits{MaxData: agentclient.NoLimit}
	sock := filepath.Join(dir, "sock")
	if l, err := net.Listen("unix", sock); err != nil {
		t.Fatal(err)
	} else {
		t.Cleanup(func() { l.Close() })
	}
	bad := []struct {
		name, path string
		lim        agentclient.CopyLimits
		want       string
		class      error
	}{
		{"missing", filepath.Join(dir, "nope"), noLimit, filepath.Join(dir, "nope") + ": no such file or directory", errdefs.ErrNotFound},
		{"under a file", filepath.Join(bigPath, "x"), noLimit, "not a directory", errdefs.ErrNotFound},
		{"directory", dir, noLimit, "is a directory", errdefs.ErrInvalidArgument},
		{"fifo", fifo, noLimit, "is a FIFO, not a regular file", errdefs.ErrInvalidArgument},
		{"socket", sock, noLimit, "is a socket, not a regular file", errdefs.ErrInvalidArgument},
		{"char device", "/dev/null", noLimit, "is a character device", errdefs.ErrInvalidArgument},
		{"name too long", filepath.Join(dir, strings.Repeat("n", 300)), noLimit, "file name too long", errdefs.ErrInvalidArgument},
		{"over the limit", bigPath, agentclient.CopyLimits{MaxSize: 1000, MaxData: agentclient.NoLimit}, "over the limit of 1000", errdefs.ErrInvalidArgument},
		{"negative limit", bigPath, agentclient.CopyLimits{MaxSize: -1, MaxData: agentclient.NoLimit}, "negative", errdefs.ErrInvalidArgument},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			got, done, err := c.copyOut(tt.path, tt.lim)
			if err == nil || done != nil || !strings.Contains(err.Error(), tt.want) || len(got.b) != 0 {
				t.Errorf("got %+v, %v after %d bytes; want an error containing %q", done, err, len(got.b), tt.want)
			}
			// The class crosses the protocol: the host tells a caller's
			// mistake from its own failure.
			if !errors.Is(err, tt.class) {
				t.Errorf("error %v is of class %s; want %v", err, errdefs.Class(err), tt.class)
			}
		})
	}
}
