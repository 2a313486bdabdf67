package agentclient

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"isopod/internal/agent"
)

// sparseWriter records where each chunk was written.
type sparseWriter struct {
	mu     sync.Mutex
	chunks map[int64][]byte
}

func (w *sparseWriter) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.chunks == nil {
		w.chunks = map[int64][]byte{}
	}
	w.chunks[off] = append([]byte(nil), p...)
	return len(p), nil
}

func (w *sparseWriter) total() (n int64) {
	for _, c := range w.chunks {
		n += int64(len(c))
	}
	return n
}

// TestCopyOutSparse: holes and runs of zeros are not sent, the data is at
// its offsets, the size is the file's, and the data cap holds exactly.
func TestCopyOutSparse(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	path := filepath.Join(t.TempDir(), "sparse")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteAt([]byte("head"), 0)
	f.WriteAt(make([]byte, 1<<20), 64<<10)         // explicit zeros
	f.WriteAt(bytes.Repeat([]byte("d"), 5), 3<<30) // data past a 3 GiB hole
	f.Truncate(4 << 30)
	f.Close()

	w := &sparseWriter{}
	done, err := c.CopyOut(context.Background(), path, CopyLimits{MaxSize: 8 << 30, MaxData: NoLimit}, w)
	if err != nil {
		t.Fatal(err)
	}
	if done.Bytes != 4<<30 || done.Data != w.total() || w.total() > 64<<10 {
		t.Fatalf("done %+v, %d bytes written; want the 4 GiB size and only the non-zero chunks", done, w.total())
	}
	if !bytes.HasPrefix(w.chunks[0], []byte("head")) || !bytes.HasPrefix(w.chunks[3<<30], []byte("ddddd")) {
		t.Errorf("chunks at %v", keys(w.chunks))
	}

	for _, tt := range []struct {
		name string
		lim  CopyLimits
		want string
	}{
		{"size over the limit", CopyLimits{MaxSize: 1 << 30, MaxData: NoLimit}, "over the limit"},
		{"data over the cap", CopyLimits{MaxSize: 8 << 30, MaxData: 10}, "copy-out limit"},
		{"no data allowed", CopyLimits{MaxSize: 8 << 30, MaxData: 0}, "copy-out limit"},
	} {
		_, err := c.CopyOut(context.Background(), path, tt.lim, &sparseWriter{})
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want an error saying %q", tt.name, err, tt.want)
		}
	}
	// A file of holes only passes a zero data cap.
	holes := filepath.Join(t.TempDir(), "holes")
	os.WriteFile(holes, nil, 0o644)
	os.Truncate(holes, 1<<30)
	if done, err := c.CopyOut(context.Background(), holes, CopyLimits{MaxData: 0}, &sparseWriter{}); err != nil || done.Bytes != 1<<30 || done.Data != 0 {
		t.Errorf("holes only: %+v, %v", done, err)
	}
}

func keys(m map[int64][]byte) []int64 {
	var k []int64
	for o := range m {
		k = append(k, o)
	}
	return k
}
