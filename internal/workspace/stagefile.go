//go:build linux

package workspace

import (
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// stageFile copies the data src held at its stat fst into a new file name
// in the staging directory dst, with its mode and time, and returns how
// many bytes fewer than fst's size it copied (a file that shrank). A
// sparse file's holes stay holes.
func stageFile(src *os.File, dst int, rel, name string, fst *unix.Stat_t) (int64, error) {
	out, err := unix.Openat(dst, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return 0, fmt.Errorf("staging %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(out), rel)
	defer f.Close()
	var n int64
	if fst.Blocks*512 < fst.Size {
		n, err = copyHoles(f, src, fst.Size)
	} else {
		// Copy what the file held at its stat; *os.File uses
		// copy_file_range.
		n, err = io.Copy(f, io.LimitReader(src, fst.Size))
	}
	if err != nil {
		return 0, fmt.Errorf("copying %s: %w", rel, err)
	}
	if err := unix.Fchmod(out, fst.Mode&0o777); err != nil {
		return 0, fmt.Errorf("staging %s: %w", rel, err)
	}
	if err := f.Close(); err != nil {
		return 0, fmt.Errorf("staging %s: %w", rel, err)
	}
	return fst.Size - n, setTime(dst, name, rel, fst.Mtim)
}

// copyHoles copies the first size bytes of src into dst, both at offset 0,
// only the ranges src holds data in (SEEK_DATA, SEEK_HOLE): its holes stay
// holes in dst. It returns how long dst is: size, or less when src ended
// sooner (it shrank meanwhile).
func copyHoles(dst, src *os.File, size int64) (int64, error) {
	sfd := int(src.Fd())
	var end int64 // the end of what was copied
	for off := int64(0); off < size; {
		data, err := unix.Seek(sfd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // no data from off on: a hole to the end, or the end
		}
		hole := size
		if err != nil {
			data = off // holes unknown here: the rest is data
		} else if h, err := unix.Seek(sfd, data, unix.SEEK_HOLE); err == nil {
			hole = min(h, size)
		}
		if data >= size {
			break
		}
		if _, err := src.Seek(data, io.SeekStart); err != nil {
			return 0, err
		}
		if _, err := dst.Seek(data, io.SeekStart); err != nil {
			return 0, err
		}
		n, err := io.Copy(dst, io.LimitReader(src, hole-data))
		if err != nil {
			return 0, err
		}
		end = data + n
		if n < hole-data {
			return end, nil // src ended: it shrank
		}
		off = hole
	}
	var st unix.Stat_t
	if err := unix.Fstat(sfd, &st); err != nil {
		return 0, err
	}
	end = max(end, min(size, st.Size))
	return end, dst.Truncate(end)
}
