package image

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/hosttool"
	"isopod/internal/paths"
)

// Fixed identity of every scratch file system, so templates are
// interchangeable. The guest finds the disk by its virtio serial, never by
// UUID or label.
const (
	ScratchLabel    = "isopod-scratch"
	scratchUUID     = "6973706f-6473-4372-8174-636800000001"
	scratchHashSeed = "6973706f-6473-4372-8174-636800000002"
)

// Scratch size bounds a template accepts.
const (
	MinScratchTemplateMiB = 16
	MaxScratchTemplateMiB = 1 << 20
)

// ScratchTemplatePath is where the template for sizeMiB lives.
func ScratchTemplatePath(paths paths.Paths, sizeMiB int) string {
	return filepath.Join(paths.Images(), "scratch-"+strconv.Itoa(sizeMiB)+".ext4")
}

// ScratchTemplate returns a sparse, empty ext4 file system of sizeMiB,
// making it once (under a lock, published by rename). It has no journal: the
// guest syncs before power-off. Copy it per run with CopySparse.
func ScratchTemplate(paths paths.Paths, sizeMiB int) (string, error) {
	if sizeMiB < MinScratchTemplateMiB || sizeMiB > MaxScratchTemplateMiB {
		return "", fmt.Errorf("scratch size %d MiB out of range [%d, %d]: %w", sizeMiB, MinScratchTemplateMiB, MaxScratchTemplateMiB, errdefs.ErrInvalidArgument)
	}
	dst := ScratchTemplatePath(paths, sizeMiB)
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	if err := os.MkdirAll(paths.Images(), 0o755); err != nil {
		return "", fmt.Errorf("creating images directory: %w", err)
	}
	unlock, err := lock(paths, "scratch")
	if err != nil {
		return "", err
	}
	defer unlock()
	if _, err := os.Stat(dst); err == nil {
		return dst, nil
	}
	bin, err := hosttool.Find("mkfs.ext4")
	if err != nil {
		return "", fmt.Errorf("making the scratch disk template: %w", err)
	}
	f, err := os.CreateTemp(paths.Images(), ".tmp-scratch-")
	if err != nil {
		return "", err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	err = f.Truncate(int64(sizeMiB) << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("sizing scratch template: %w", err)
	}
	cmd := exec.Command(bin, "-q", "-F", "-t", "ext4", "-O", "^has_journal",
		"-E", "lazy_itable_init=0,lazy_journal_init=0,root_owner=0:0,hash_seed="+scratchHashSeed,
		"-U", scratchUUID, "-L", ScratchLabel, "-m", "0", tmp)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(out.String()))
	}
	if err := os.Chmod(tmp, 0o644); err != nil {
		return "", err
	}
	if err := publishFile(tmp, dst); err != nil {
		return "", err
	}
	return dst, nil
}

// CopySparse copies the regular file src to dst (created or truncated),
// sharing blocks by reflink when the file system can, else copying only the
// data extents so holes stay holes. It does not fsync dst.
func CopySparse(dst, src string) error {
	in, err := os.Open(src)
	if err != nil {
		return fmt.Errorf("copying %s: %w", src, err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return fmt.Errorf("copying %s: not a regular file: %w", src, errdefs.ErrInvalidArgument)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("creating %s: %w", dst, err)
	}
	if err := copySparse(out, in, fi.Size()); err != nil {
		out.Close()
		os.Remove(dst)
		return fmt.Errorf("copying %s to %s: %w", src, dst, err)
	}
	return out.Close()
}

func copySparse(out, in *os.File, size int64) error {
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err == nil {
		return nil
	}
	if err := out.Truncate(size); err != nil {
		return err
	}
	ifd := int(in.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(ifd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seeking data: %w", err)
		}
		hole, err := unix.Seek(ifd, data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seeking hole: %w", err)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off from in to the same offset in out, in
// the kernel when it can.
func copyRange(out, in *os.File, off, n int64) error {
	roff, woff := off, off
	for n > 0 {
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
				_, err = io.Copy(io.NewOffsetWriter(out, woff), io.NewSectionReader(in, roff, n))
				return err
			}
			return fmt.Errorf("copy_file_range: %w", err)
		}
		if c == 0 {
			return io.ErrUnexpectedEOF
		}
		n -= int64(c)
	}
	return nil
}
