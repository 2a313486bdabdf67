//go:build linux

package workspace

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// The staging copy is read back one component at a time from its root's
// descriptor, never following a symlink: it holds the user's links as they
// were, and a name from a guest must not reach through one of them.

// errAbsent says a path is not in the staging copy, or lies below something
// that is not a directory there (a file or a symlink).
var errAbsent = errors.New("absent")

// openParent opens the directory that holds rel's last component and
// returns it with that component. The caller closes the descriptor.
func openParent(root int, rel string) (int, string, error) {
	dir, name := "", rel
	if i := strings.LastIndexByte(rel, '/'); i >= 0 {
		dir, name = rel[:i], rel[i+1:]
	}
	fd, err := unix.Openat(root, ".", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, "", err
	}
	for dir != "" {
		var c string
		c, dir, _ = strings.Cut(dir, "/")
		next, err := unix.Openat(fd, c, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(fd)
		switch {
		case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ENOTDIR), errors.Is(err, unix.ELOOP):
			return -1, "", errAbsent
		case err != nil:
			return -1, "", err
		}
		fd = next
	}
	return fd, name, nil
}

// lstatBeneath stats rel itself (a link is not followed).
func lstatBeneath(root int, rel string) (unix.Stat_t, error) {
	var st unix.Stat_t
	fd, name, err := openParent(root, rel)
	if err != nil {
		return st, err
	}
	defer unix.Close(fd)
	err = unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if errors.Is(err, unix.ENOENT) {
		err = errAbsent
	}
	return st, err
}

// openBeneath opens rel for reading; a symlink anywhere on the way, last
// component included, is refused.
func openBeneath(root int, rel string, flags int) (*os.File, error) {
	fd, name, err := openParent(root, rel)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	f, err := unix.Openat(fd, name, flags|unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(f), rel), nil
}

// readlinkBeneath reads the target of the symlink rel.
func readlinkBeneath(root int, rel string) (string, error) {
	fd, name, err := openParent(root, rel)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	return readlinkat(fd, name)
}

// origEntry is a file or symlink of the staging copy.
type origEntry struct {
	rel  string
	mode uint32 // st_mode
}

// filesBeneath lists the files and symlinks below the directory rel, in
// name order.
func filesBeneath(root int, rel string) ([]origEntry, error) {
	d, err := openBeneath(root, rel, unix.O_DIRECTORY)
	if err != nil {
		return nil, fmt.Errorf("reading the copy of %s: %w", rel, err)
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("reading the copy of %s: %w", rel, err)
	}
	sort.Strings(names)
	var out []origEntry
	for _, name := range names {
		var st unix.Stat_t
		p := rel + "/" + name
		if err := unix.Fstatat(int(d.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return nil, fmt.Errorf("reading the copy of %s: %w", p, err)
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			sub, err := filesBeneath(root, p)
			if err != nil {
				return nil, err
			}
			out = append(out, sub...)
		case unix.S_IFREG, unix.S_IFLNK:
			out = append(out, origEntry{rel: p, mode: st.Mode})
		}
	}
	return out, nil
}

// inParent runs f on the directory holding rel's last component, open as
// O_PATH, and that component; f may add and remove entries there even when
// the directory is read-only, and the directory keeps its mode and time.
func inParent(root int, rel string, f func(dir int, name string) error) error {
	fd, name, err := openParent(root, rel)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var dir unix.Stat_t
	if err := unix.Fstat(fd, &dir); err != nil {
		return err
	}
	// An O_PATH descriptor's directory is changed through its name in
	// /proc.
	self := "/proc/self/fd/" + strconv.Itoa(fd)
	if dir.Mode&0o200 == 0 {
		if err := unix.Chmod(self, dir.Mode&0o7777|0o200); err != nil {
			return err
		}
		defer unix.Chmod(self, dir.Mode&0o7777)
	}
	if err := f(fd, name); err != nil {
		return err
	}
	return unix.UtimesNano(self, []unix.Timespec{dir.Mtim, dir.Mtim})
}

// removeBeneath removes the file or symlink rel of the staging copy and
// returns the bytes it held.
func removeBeneath(root int, rel string) (int64, error) {
	var size int64
	err := inParent(root, rel, func(dir int, name string) error {
		var st unix.Stat_t
		if err := unix.Fstatat(dir, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return err
		}
		switch st.Mode & unix.S_IFMT {
		case unix.S_IFDIR:
			return fmt.Errorf("%s is a directory", rel)
		case unix.S_IFREG:
			size = st.Size
		}
		return unix.Unlinkat(dir, name, 0)
	})
	return size, err
}

// replaceBeneath puts a regular file holding body, with the mode perm and
// the time mtime, in place of the file or symlink rel of the staging copy
// (never writing through a link).
func replaceBeneath(root int, rel string, body []byte, perm uint32, mtime unix.Timespec) error {
	return inParent(root, rel, func(dir int, name string) error {
		if err := unix.Unlinkat(dir, name, 0); err != nil && !errors.Is(err, unix.ENOENT) {
			return err
		}
		fd, err := unix.Openat(dir, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return err
		}
		f := os.NewFile(uintptr(fd), rel)
		_, err = f.Write(body)
		if err == nil {
			err = unix.Fchmod(fd, perm)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		return setTime(dir, name, rel, mtime)
	})
}
