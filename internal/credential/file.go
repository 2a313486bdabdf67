package credential

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"

	"isopod/internal/errdefs"
)

// MaxFileSize caps the store and a secret's file.
const MaxFileSize = 64 << 10

// errMissing marks a private file that does not exist.
var errMissing = errors.New("does not exist")

// readPrivate reads a file only its owner can read: a regular file (a
// symbolic link is refused, not followed), owned by this process's user,
// without group or other permission bits, at most MaxFileSize bytes.
// Errors are errdefs.ErrFailedPrecondition (wrapping errMissing when the
// file does not exist), name path and say how to fix it; they never hold
// the file's content.
func readPrivate(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s %w: %w", path, errMissing, errdefs.ErrFailedPrecondition)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if err := checkPrivate(path, fi); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	defer f.Close()
	ofi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", err, errdefs.ErrFailedPrecondition)
	}
	if !os.SameFile(fi, ofi) {
		return nil, fmt.Errorf("%s changed while it was read: try again: %w", path, errdefs.ErrFailedPrecondition)
	}
	if err := checkPrivate(path, ofi); err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w: %w", path, err, errdefs.ErrFailedPrecondition)
	}
	if len(b) > MaxFileSize {
		return nil, fmt.Errorf("%s grew over %d bytes while it was read: %w", path, MaxFileSize, errdefs.ErrFailedPrecondition)
	}
	return b, nil
}

// checkPrivate checks what readPrivate requires of fi.
func checkPrivate(path string, fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%s is a symbolic link: name the file itself, or replace the link by the file: %w", path, errdefs.ErrFailedPrecondition)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%s is not a regular file: %w", path, errdefs.ErrFailedPrecondition)
	case fi.Mode().Perm()&0o077 != 0:
		return fmt.Errorf("%s has mode %04o, readable or writable by others: chmod 600 %s: %w",
			path, fi.Mode().Perm(), path, errdefs.ErrFailedPrecondition)
	case fi.Size() > MaxFileSize:
		return fmt.Errorf("%s has %d bytes, over the limit of %d: %w", path, fi.Size(), MaxFileSize, errdefs.ErrFailedPrecondition)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return fmt.Errorf("%s is owned by uid %d, not by this user (uid %d): chown %d %s: %w",
			path, st.Uid, os.Getuid(), os.Getuid(), path, errdefs.ErrFailedPrecondition)
	}
	return nil
}
