package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// A snapshot's RAM file is written sparse: every page of guest RAM that
// holds only zeros (a quarter or more of a freshly booted guest's touched
// RAM) is a hole, which reads back as zeros, maps privately as zeros, and
// costs neither disk, page cache, nor a byte of the sealed copy a jailed
// QEMU before 8.2 restores from.

// sparsePage is the unit checked for zeros: the host's page, and the
// block of the file systems snapshots live on.
const sparsePage = 4096

// sparseChunk is how much of the source is read at a time.
const sparseChunk = 4 << 20

// copyNonZero copies the first size bytes of src to dst at the same
// offsets, writing only the pages of src's data extents that hold a
// non-zero byte, and sets dst's size: dst, new and empty, gets a hole for
// every page of zeros. Each chunk's writeback to disk starts as soon as
// it is written (sync_file_range), so that a flush after the copy (a
// pause's) finds little left to write. It returns the bytes written.
func copyNonZero(dst, src *os.File, size int64) (int64, error) {
	if err := dst.Truncate(size); err != nil {
		return 0, err
	}
	buf := make([]byte, sparseChunk)
	var written int64
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(src.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		} else if err != nil {
			return written, fmt.Errorf("seeking: %w", err)
		}
		hole, err := unix.Seek(int(src.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return written, fmt.Errorf("seeking: %w", err)
		}
		hole = min(hole, size)
		for at := data; at < hole; {
			n := min(hole-at, sparseChunk)
			b := buf[:n]
			if _, err := src.ReadAt(b, at); err != nil {
				return written, fmt.Errorf("reading: %w", err)
			}
			w, err := writeNonZero(dst, b, at)
			written += w
			if err != nil {
				return written, fmt.Errorf("writing: %w", err)
			}
			if w > 0 {
				// A hint: a file system without it flushes at the end.
				unix.SyncFileRange(int(dst.Fd()), at, n, unix.SYNC_FILE_RANGE_WRITE)
			}
			at += n
		}
		off = hole
	}
	return written, nil
}

// zeroPage is a page of zeros to compare with.
var zeroPage = make([]byte, sparsePage)

// writeNonZero writes b to dst at off, each run of pages (counted from off,
// which is page-aligned) with a non-zero byte in one write, and skips the
// pages of zeros.
func writeNonZero(dst *os.File, b []byte, off int64) (int64, error) {
	var written int64
	run := -1 // start of the current run of non-zero pages
	flush := func(end int) error {
		if run < 0 {
			return nil
		}
		n, err := dst.WriteAt(b[run:end], off+int64(run))
		written += int64(n)
		run = -1
		return err
	}
	for p := 0; p < len(b); p += sparsePage {
		page := b[p:min(p+sparsePage, len(b))]
		if bytes.Equal(page, zeroPage[:len(page)]) {
			if err := flush(p); err != nil {
				return written, err
			}
		} else if run < 0 {
			run = p
		}
	}
	return written, flush(len(b))
}
