package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A copy-in (KindPutFile) writes the host's bytes to a temporary file
// beside the destination and renames it there only once every byte is
// written, so the destination is never seen half-written; any failure
// removes the temporary file.

// errPutWindow is a host that sent more put_file chunks than the window
// allows: the connection ends.
var errPutWindow = errors.New("put_file window overrun")

// putChunk is one KindFileChunk frame of a copy-in.
type putChunk struct {
	m *agentproto.Msg
	p []byte
}

var putSeq atomic.Uint64

// startPut registers the copy-in before returning, so that the chunks that
// follow at once find it, and receives it in a handler.
func (c *conn) startPut(m *agentproto.Msg) {
	ch := make(chan putChunk, 2*agentproto.PutWindow)
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.puts[m.ID]; dup {
		go c.replyErr(m.ID, fmt.Errorf("put_file: id %d is already in use; use a fresh id: %w", m.ID, errdefs.ErrInvalidArgument))
		return
	}
	c.puts[m.ID] = ch
	if !c.spawnLocked(func() {
		size, mode, err := c.putFile(m, ch)
		c.mu.Lock()
		delete(c.puts, m.ID)
		c.mu.Unlock()
		if err != nil {
			c.replyErr(m.ID, err)
			return
		}
		c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileDone, File: &agentproto.FileDone{Bytes: size, Data: size, Mode: mode}}, nil)
	}) {
		delete(c.puts, m.ID)
	}
}

// routePut queues a copy-in's chunk without blocking; chunks of a copy-in
// that has ended are dropped.
func (c *conn) routePut(m *agentproto.Msg, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.puts[m.ID]
	if ch == nil {
		c.log.Debug("file chunk for no copy-in", "id", m.ID)
		return nil
	}
	select {
	case ch <- putChunk{m, payload}:
		return nil
	default:
		return fmt.Errorf("put_file %d: more than %d unacknowledged chunks (the window is %d): %w", m.ID, cap(ch), agentproto.PutWindow, errPutWindow)
	}
}

// putDest checks a copy-in's destination: a path that is absent or a
// regular file, in a directory made when missing.
func putDest(m *agentproto.Msg) (string, error) {
	path := m.Path
	switch {
	case path == "":
		return "", fmt.Errorf("put_file: no path given: %w", errdefs.ErrInvalidArgument)
	case len(path) >= agentproto.MaxPath:
		return "", fmt.Errorf("put_file: the path is %d bytes, over the guest's limit of %d: %w", len(path), agentproto.MaxPath-1, errdefs.ErrInvalidArgument)
	case m.MaxBytes < 0:
		return "", fmt.Errorf("put_file %s: negative size limit: %w", path, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(DefaultCwd, path)
	}
	path = filepath.Clean(path)
	if path == "/" {
		return "", fmt.Errorf("put_file /: is a directory: %w", errdefs.ErrInvalidArgument)
	}
	if err := refuseDest(path); err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("put_file %s: making its directory: %s: %w", path, errnoText(err), errdefs.ErrInvalidArgument)
	}
	return path, nil
}

// refuseDest refuses a destination that exists and is not a regular file
// (a rename would replace a symlink or a special file, and cannot replace
// a directory).
func refuseDest(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("put_file %s: a parent is not a directory: %w", path, errdefs.ErrInvalidArgument)
	case err != nil:
		return fmt.Errorf("put_file %s: %w", path, err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("put_file %s: is %s, not a regular file; only a regular file can be replaced: %w", path, agentproto.FileKind(fi.Mode()), errdefs.ErrInvalidArgument)
	}
	return nil
}

// putFile receives a copy-in and returns its size and mode.
func (c *conn) putFile(m *agentproto.Msg, ch <-chan putChunk) (int64, uint32, error) {
	path, err := putDest(m)
	if err != nil {
		return 0, 0, err
	}
	mode := fs.FileMode(0o644)
	if m.Put != nil && m.Put.Mode != 0 {
		mode = fs.FileMode(m.Put.Mode).Perm()
	}
	tmp := filepath.Join(filepath.Dir(path), "."+filepath.Base(path)+".isopod-put-"+strconv.FormatUint(putSeq.Add(1), 10)+".part")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return 0, 0, fmt.Errorf("put_file %s: %w", path, err)
	}
	size, err := c.receiveChunks(m, ch, f)
	if err == nil {
		err = f.Chmod(mode)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		if err = refuseDest(path); err == nil {
			err = os.Rename(tmp, path)
		}
	}
	if err != nil {
		os.Remove(tmp)
		return 0, 0, fmt.Errorf("put_file %s: %w", path, err)
	}
	return size, uint32(mode), nil
}

// receiveChunks writes the copy-in's chunks in order into f, acknowledging
// each, until the one with EOF.
func (c *conn) receiveChunks(m *agentproto.Msg, ch <-chan putChunk, f *os.File) (int64, error) {
	var size int64
	for {
		var k putChunk
		select {
		case k = <-ch:
		case <-c.ctx.Done():
			return size, fmt.Errorf("the connection ended after %d bytes: %w", size, errdefs.ErrUnavailable)
		}
		switch {
		case k.m.Abort:
			return size, fmt.Errorf("the host gave up after %d bytes: %w", size, errdefs.ErrUnavailable)
		case k.m.Offset != size:
			return size, fmt.Errorf("a chunk for offset %d after %d bytes; chunks go in order: %w", k.m.Offset, size, errdefs.ErrInvalidArgument)
		case m.MaxBytes > 0 && size+int64(len(k.p)) > m.MaxBytes:
			return size, fmt.Errorf("more than %d bytes, the copy-in limit: %w", m.MaxBytes, errdefs.ErrInvalidArgument)
		}
		if _, err := f.Write(k.p); err != nil {
			return size, fmt.Errorf("writing: %s", errnoText(err))
		}
		size += int64(len(k.p))
		c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileAck}, nil)
		if k.m.EOF {
			return size, nil
		}
	}
}
