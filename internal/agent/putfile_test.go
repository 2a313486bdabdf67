package agent

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// noTemp fails when dir holds a copy-in's temporary file.
func noTemp(t *testing.T, dir string) {
	t.Helper()
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".isopod-put-") {
			t.Errorf("temporary file %s left in %s", e.Name(), dir)
		}
	}
}

// A copy-in writes the file whole, with its mode, making its directories,
// and replaces a regular file.
func TestPutFile(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	dir := t.TempDir()
	data := make([]byte, 5*agentproto.ChunkSize*agentproto.PutWindow+123) // more chunks than the window
	rand.Read(data)
	dest := filepath.Join(dir, "a", "b", "file")
	n, err := c.PutFile(ctx, dest, 0o750, int64(len(data)), bytes.NewReader(data))
	if err != nil || n != int64(len(data)) {
		t.Fatalf("PutFile: %d, %v", n, err)
	}
	got, err := os.ReadFile(dest)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the guest file differs (%d bytes, %v)", len(got), err)
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o750 {
		t.Errorf("mode %v; want 0750", fi.Mode().Perm())
	}
	if _, err := c.PutFile(ctx, dest, 0, 0, strings.NewReader("new")); err != nil {
		t.Fatalf("replacing a file: %v", err)
	}
	if got, _ := os.ReadFile(dest); string(got) != "new" {
		t.Errorf("replaced file holds %q", got)
	}
	if fi, _ := os.Stat(dest); fi.Mode().Perm() != 0o644 {
		t.Errorf("default mode %v; want 0644", fi.Mode().Perm())
	}
	empty := filepath.Join(dir, "empty")
	if n, err := c.PutFile(ctx, empty, 0, 10, strings.NewReader("")); err != nil || n != 0 {
		t.Errorf("an empty file: %d, %v", n, err)
	}
	noTemp(t, filepath.Dir(dest))
}

// A copy-in that fails leaves the destination as it was and no temporary
// file: over the limit, a source that fails, a destination that is not a
// regular file.
func TestPutFileRefusals(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	dir := t.TempDir()
	dest := filepath.Join(dir, "f")
	os.WriteFile(dest, []byte("old"), 0o644)
	fifo := filepath.Join(dir, "fifo")
	if err := unix.Mkfifo(fifo, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Symlink(dest, filepath.Join(dir, "link"))
	big := bytes.Repeat([]byte("x"), 3*agentproto.ChunkSize)
	tests := []struct {
		name  string
		path  string
		max   int64
		r     io.Reader
		class error
		part  string
	}{
		{"over the limit", dest, int64(len(big)) - 1, bytes.NewReader(big), errdefs.ErrInvalidArgument, "copy-in limit"},
		{"source fails", dest, 0, io.MultiReader(bytes.NewReader(big), errReader{}), nil, "reading the source"},
		{"a directory", dir, 0, strings.NewReader("x"), errdefs.ErrInvalidArgument, "is a directory"},
		{"a FIFO", fifo, 0, strings.NewReader("x"), errdefs.ErrInvalidArgument, "is a FIFO"},
		{"a symlink", filepath.Join(dir, "link"), 0, strings.NewReader("x"), errdefs.ErrInvalidArgument, "is a symlink"},
		{"under a file", filepath.Join(dest, "sub"), 0, strings.NewReader("x"), errdefs.ErrInvalidArgument, "not a directory"},
		{"no path", "", 0, strings.NewReader("x"), errdefs.ErrInvalidArgument, "no path"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := c.PutFile(ctx, tt.path, 0, tt.max, tt.r)
			if err == nil || !strings.Contains(err.Error(), tt.part) || (tt.class != nil && !errors.Is(err, tt.class)) {
				t.Fatalf("PutFile: %v; want %q, %v", err, tt.part, tt.class)
			}
			if got, _ := os.ReadFile(dest); string(got) != "old" {
				t.Errorf("the destination holds %q after a failed copy-in", got)
			}
		})
	}
	// The agent removes the temporary file when the abort reaches it.
	waitFor(t, "the aborted copy-in's temporary file to go", func() bool {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.Contains(e.Name(), ".isopod-put-") {
				return false
			}
		}
		return true
	})
	// The connection still serves.
	if r := c.exec(agentproto.Exec{Argv: []string{"true"}}); r.code() != 0 {
		t.Errorf("exec after the refusals: %+v", r.done)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errors.New("disk on fire") }
