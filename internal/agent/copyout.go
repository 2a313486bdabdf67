package agent

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// copyOut streams one regular guest file to the host as KindFileChunk
// frames followed by KindFileDone. Any failure, before or during the
// stream, ends the request with KindError.
func (c *conn) copyOut(m *agentproto.Msg) {
	n, mode, err := c.streamFile(m)
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileDone, File: &agentproto.FileDone{Bytes: n, Mode: mode}}, nil)
}

func (c *conn) streamFile(m *agentproto.Msg) (int64, uint32, error) {
	path := m.Path
	if path == "" {
		return 0, 0, fmt.Errorf("copy out: no path given: %w", errdefs.ErrInvalidArgument)
	}
	if m.MaxBytes < 0 {
		return 0, 0, fmt.Errorf("copy out %s: max_bytes %d is negative: %w", path, m.MaxBytes, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(DefaultCwd, path)
	}
	// O_NONBLOCK keeps a FIFO from blocking the open; it is refused below.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, unix.ENOENT) {
			err = fmt.Errorf("%w: %w", err, errdefs.ErrNotFound)
		}
		return 0, 0, fmt.Errorf("copy out %s: %w", path, err)
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, fmt.Errorf("copy out %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		what := "not a regular file"
		if fi.IsDir() {
			what = "a directory"
		}
		return 0, 0, fmt.Errorf("copy out %s: is %s; only regular files can be copied out: %w", path, what, errdefs.ErrInvalidArgument)
	}
	if m.MaxBytes > 0 && fi.Size() > m.MaxBytes {
		return 0, 0, fmt.Errorf("copy out %s: the file is %d bytes, over the limit of %d: %w", path, fi.Size(), m.MaxBytes, errdefs.ErrInvalidArgument)
	}
	buf := make([]byte, agentproto.ChunkSize)
	var total int64
	for {
		n, err := f.Read(buf)
		if n > 0 {
			total += int64(n)
			if m.MaxBytes > 0 && total > m.MaxBytes {
				return 0, 0, fmt.Errorf("copy out %s: the file grew past the limit of %d bytes while being read: %w", path, m.MaxBytes, errdefs.ErrInvalidArgument)
			}
			if err := c.send(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileChunk}, buf[:n]); err != nil {
				return 0, 0, fmt.Errorf("copy out %s: sending: %w", path, err)
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil {
			return 0, 0, fmt.Errorf("copy out %s: reading after %d bytes: %w", path, total, err)
		}
	}
	return total, uint32(fi.Mode().Perm()), nil
}
