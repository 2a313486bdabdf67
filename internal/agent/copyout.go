package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// copyOut streams one regular guest file's data to the host as
// KindFileChunk frames followed by KindFileDone. Any failure, before or
// during the stream, ends the request with KindError.
func (c *conn) copyOut(m *agentproto.Msg) {
	size, sent, mode, err := c.streamFile(m)
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileDone, File: &agentproto.FileDone{Bytes: size, Data: sent, Mode: mode}}, nil)
}

func (c *conn) streamFile(m *agentproto.Msg) (size, sent int64, mode uint32, err error) {
	path := m.Path
	if path == "" {
		return 0, 0, 0, fmt.Errorf("copy out: no path given: %w", errdefs.ErrInvalidArgument)
	}
	if m.MaxBytes < 0 || (m.MaxData != nil && *m.MaxData < 0) {
		return 0, 0, 0, fmt.Errorf("copy out %s: negative limits: %w", path, errdefs.ErrInvalidArgument)
	}
	if !filepath.IsAbs(path) {
		path = filepath.Join(DefaultCwd, path)
	}
	// A path that does not name a regular file is the caller's mistake,
	// said with the file's type; it is looked at before it is opened.
	if fi, err := os.Stat(path); err != nil {
		return 0, 0, 0, openErr(path, err)
	} else if !fi.Mode().IsRegular() {
		return 0, 0, 0, notRegular(path, fi.Mode())
	}
	// O_NONBLOCK keeps a FIFO put there meanwhile from blocking the open;
	// it is refused below.
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, 0, openErr(path, &os.PathError{Op: "open", Path: path, Err: err})
	}
	f := os.NewFile(uintptr(fd), path)
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, 0, 0, fmt.Errorf("copy out %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return 0, 0, 0, notRegular(path, fi.Mode())
	}
	size = fi.Size()
	if m.MaxBytes > 0 && size > m.MaxBytes {
		return 0, 0, 0, fmt.Errorf("copy out %s: the file is %d bytes, over the limit of %d: %w", path, size, m.MaxBytes, errdefs.ErrInvalidArgument)
	}
	sent, err = c.sendData(m, f, size)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("copy out %s: %w", path, err)
	}
	return size, sent, uint32(fi.Mode().Perm()), nil
}

// openErr says why path cannot be read, classed: a path that does not
// exist (or runs through a file) is not found, one that cannot name a
// file (too long, a loop of links) is invalid.
func openErr(path string, err error) error {
	reason := err.Error()
	var pe *os.PathError
	if errors.As(err, &pe) {
		reason = pe.Err.Error()
	}
	switch {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR):
		return fmt.Errorf("copy out %s: %s (the guest has no such file when the command ends): %w", path, reason, errdefs.ErrNotFound)
	case errors.Is(err, unix.ENAMETOOLONG), errors.Is(err, unix.ELOOP), errors.Is(err, unix.EINVAL):
		return fmt.Errorf("copy out %s: %s: %w", path, reason, errdefs.ErrInvalidArgument)
	}
	return fmt.Errorf("copy out %s: %w", path, err)
}

// notRegular refuses a path that names something other than a regular
// file, naming what it is.
func notRegular(path string, mode fs.FileMode) error {
	return fmt.Errorf("copy out %s: is %s, not a regular file; only regular files can be copied out (have the command write what you want into a file): %w",
		path, agentproto.FileKind(mode), errdefs.ErrInvalidArgument)
}

// sendData sends the first size bytes of f as chunks that say where they
// belong, leaving out holes (found with SEEK_DATA and SEEK_HOLE) and chunks
// that are all zeros. It returns the data bytes sent.
func (c *conn) sendData(m *agentproto.Msg, f *os.File, size int64) (int64, error) {
	fd := int(f.Fd())
	buf := make([]byte, agentproto.ChunkSize)
	var sent int64
	for off := int64(0); off < size; {
		data, hole := nextExtent(fd, off, size)
		if data >= size {
			break
		}
		for p := data; p < hole; {
			n, err := unix.Pread(fd, buf[:min(int64(len(buf)), hole-p)], p)
			if err != nil {
				return sent, fmt.Errorf("reading at %d: %w", p, err)
			}
			if n == 0 {
				break // the file shrank while being read
			}
			if !allZero(buf[:n]) {
				sent += int64(n)
				if m.MaxData != nil && sent > *m.MaxData {
					return sent, fmt.Errorf("more than %d bytes of data, the copy-out limit: %w", *m.MaxData, errdefs.ErrInvalidArgument)
				}
				if err := c.send(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindFileChunk, Offset: p}, buf[:n]); err != nil {
					return sent, fmt.Errorf("sending: %w", err)
				}
			}
			p += int64(n)
		}
		off = hole
	}
	return sent, nil
}

// nextExtent returns the next data extent at or after off: its start and
// where the hole after it begins (both at most size). A filesystem without
// SEEK_DATA gives the rest of the file as one extent.
func nextExtent(fd int, off, size int64) (data, hole int64) {
	data, err := unix.Seek(fd, off, unix.SEEK_DATA)
	switch {
	case errors.Is(err, unix.ENXIO):
		return size, size // no data after off
	case err != nil:
		return off, size
	}
	hole, err = unix.Seek(fd, data, unix.SEEK_HOLE)
	if err != nil || hole > size {
		hole = size
	}
	return min(data, size), hole
}

// allZero reports whether b holds only zero bytes.
func allZero(b []byte) bool {
	for len(b) >= 8 {
		if b[0]|b[1]|b[2]|b[3]|b[4]|b[5]|b[6]|b[7] != 0 {
			return false
		}
		b = b[8:]
	}
	for _, x := range b {
		if x != 0 {
			return false
		}
	}
	return true
}
