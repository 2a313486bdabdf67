// Package hosttool finds the host programs isopod runs (mkfs.ext4,
// mksquashfs, debugfs, newuidmap, unshare, QEMU, ...), in one place that
// every caller uses: on PATH first, then in the system directories that a
// normal user's PATH lacks on Debian and its kin (/usr/local/sbin,
// /usr/sbin, /sbin), where e2fsprogs, debootstrap and iproute2 put their
// programs. When a program is missing, the error says where it was looked
// for and which package installs it.
package hosttool

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"isopod/internal/errdefs"
)

// systemDirs are searched, in order, after PATH.
var systemDirs = []string{"/usr/local/sbin", "/usr/sbin", "/sbin"}

// pkg names the package that installs a program: on Debian and Ubuntu,
// and on Fedora ("" where it has none).
type pkg struct{ debian, fedora string }

// packages are the programs isopod (and its tests) run.
var packages = map[string]pkg{
	"mkfs.ext4":          {"e2fsprogs", "e2fsprogs"},
	"debugfs":            {"e2fsprogs", "e2fsprogs"},
	"resize2fs":          {"e2fsprogs", "e2fsprogs"},
	"e2fsck":             {"e2fsprogs", "e2fsprogs"},
	"dumpe2fs":           {"e2fsprogs", "e2fsprogs"},
	"mksquashfs":         {"squashfs-tools", "squashfs-tools"},
	"unsquashfs":         {"squashfs-tools", "squashfs-tools"},
	"newuidmap":          {"uidmap", "shadow-utils"},
	"newgidmap":          {"uidmap", "shadow-utils"},
	"unshare":            {"util-linux", "util-linux"},
	"nsenter":            {"util-linux", "util-linux"},
	"setpriv":            {"util-linux", "util-linux"},
	"useradd":            {"passwd", "shadow-utils"},
	"usermod":            {"passwd", "shadow-utils"},
	"userdel":            {"passwd", "shadow-utils"},
	"debootstrap":        {"debootstrap", "debootstrap"},
	"chroot":             {"coreutils", "coreutils"},
	"ldd":                {"libc-bin", "glibc-common"},
	"dpkg-query":         {"dpkg", ""},
	"apt-get":            {"apt", ""},
	"apt-cache":          {"apt", ""},
	"git":                {"git", "git"},
	"qemu-system-x86_64": {"qemu-system-x86", "qemu-system-x86-core"},
	"ip":                 {"iproute2", "iproute"},
	"nft":                {"nftables", "nftables"},
}

// MissingError says that a program was not found, where it was looked for
// and which package installs it. It is an errdefs.ErrFailedPrecondition.
type MissingError struct {
	Name string
	// Path is the PATH searched; Dirs the system directories searched
	// after it that PATH does not hold.
	Path string
	Dirs []string
}

func (e *MissingError) Error() string {
	where := "on PATH (" + e.Path + ")"
	if e.Path == "" {
		where = "on PATH (empty)"
	}
	if len(e.Dirs) > 0 {
		where += " or in " + strings.Join(e.Dirs, ", ")
	}
	return fmt.Sprintf("%s not found %s: %s", e.Name, where, Install(e.Name))
}

func (e *MissingError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Install says how to install the program name.
func Install(name string) string {
	p, ok := packages[name]
	if !ok {
		return "install it, or put the directory that holds it on PATH"
	}
	s := fmt.Sprintf("install %s (Debian, Ubuntu: `apt-get install %s`", p.debian, p.debian)
	if p.fedora != "" {
		s += fmt.Sprintf("; Fedora: `dnf install %s`", p.fedora)
	}
	return s + ")"
}

// Find returns the path of the program name: name itself when it holds a
// slash, else the first executable of that name on PATH, then in
// systemDirs. A missing one is a *MissingError.
func Find(name string) (string, error) {
	return find(name, os.Getenv("PATH"), systemDirs)
}

func find(name, path string, dirs []string) (string, error) {
	if strings.Contains(name, "/") {
		if err := executable(name); err != nil {
			return "", err
		}
		return name, nil
	}
	onPath := filepath.SplitList(path)
	for _, d := range onPath {
		if d == "" {
			continue // the current directory: never
		}
		if p := filepath.Join(d, name); executable(p) == nil && filepath.IsAbs(p) {
			return p, nil
		}
	}
	var extra []string
	for _, d := range dirs {
		if slices.Contains(onPath, d) {
			continue
		}
		extra = append(extra, d)
		if p := filepath.Join(d, name); executable(p) == nil {
			return p, nil
		}
	}
	return "", &MissingError{Name: name, Path: path, Dirs: extra}
}

// ErrNotExecutable is a path that names a directory, or a file no one may
// execute.
var ErrNotExecutable = errors.New("is not an executable file")

// executable says why p is not a regular file that someone may execute
// (nil: it is).
func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("%s %w", p, ErrNotExecutable)
	}
	return nil
}
