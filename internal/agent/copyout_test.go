package agent

import (
	"bytes"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// copyOut runs one copy-out and returns the data and the closing frame.
func (c *client) copyOut(path string, max int64) ([]byte, *agentproto.Msg) {
	c.t.Helper()
	id := c.id()
	c.send(&agentproto.Msg{ID: id, Kind: agentproto.KindCopyOut, Path: path, MaxBytes: max}, nil)
	var data []byte
	for {
		f := c.next(id, 10*time.Second)
		switch f.m.Kind {
		case agentproto.KindFileChunk:
			if len(f.p) > agentproto.ChunkSize {
				c.t.Fatalf("file chunk of %d bytes; the limit is %d", len(f.p), agentproto.ChunkSize)
			}
			data = append(data, f.p...)
		case agentproto.KindFileDone, agentproto.KindError:
			return data, f.m
		default:
			c.t.Fatalf("unexpected %s during copy-out", f.m.Kind)
		}
	}
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
	got, done := c.copyOut(bigPath, 6<<20)
	if done.Kind != agentproto.KindFileDone || done.File == nil {
		t.Fatalf("copy-out ended with %s %q", done.Kind, done.Error)
	}
	if !bytes.Equal(got, big) || done.File.Bytes != int64(len(big)) || done.File.Mode != 0o640 {
		t.Errorf("got %d bytes, done %+v; want %d identical bytes and mode 0640", len(got), done.File, len(big))
	}

	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, nil, 0o600)
	if got, done := c.copyOut(empty, 0); done.Kind != agentproto.KindFileDone || len(got) != 0 || done.File.Bytes != 0 {
		t.Errorf("empty file: %s %+v", done.Kind, done.File)
	}

	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	bad := []struct {
		name, path string
		max        int64
		want       string
	}{
		{"missing", filepath.Join(dir, "nope"), 0, filepath.Join(dir, "nope") + ": no such file or directory"},
		{"directory", dir, 0, "is a directory"},
		{"fifo", fifo, 0, "not a regular file"},
		{"over the limit", bigPath, 1000, "over the limit of 1000"},
		{"negative limit", bigPath, -1, "negative"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			got, done := c.copyOut(tt.path, tt.max)
			if done.Kind != agentproto.KindError || !strings.Contains(done.Error, tt.want) || len(got) != 0 {
				t.Errorf("got %s %q after %d bytes; want an error containing %q", done.Kind, done.Error, len(got), tt.want)
			}
		})
	}
}
