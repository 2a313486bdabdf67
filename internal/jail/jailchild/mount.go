//go:build linux

package jailchild

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// The jail's root is built in a staging tmpfs: host paths are bound into
// it from where the old root was moved, then it becomes the root and is
// made read-only. Nothing the VMM does there reaches the host.
const (
	stage   = "/tmp" // hidden by the staging tmpfs, in this namespace only
	newRoot = "/newroot"
	oldRoot = "/oldroot"
)

// buildRoot makes a root that holds only binds and a /proc of the jail's
// own pid namespace, and switches to it.
func buildRoot(binds []Bind) error {
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("making mounts private: %w", err)
	}
	if err := unix.Mount("tmpfs", stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1m"); err != nil {
		return fmt.Errorf("mounting the staging root: %w", err)
	}
	for _, d := range []string{stage + newRoot, stage + oldRoot} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("staging root: %w", err)
		}
	}
	// The new root must be a mount of its own to be pivoted to.
	if err := unix.Mount(stage+newRoot, stage+newRoot, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("staging root: %w", err)
	}
	if err := unix.Chdir(stage); err != nil {
		return fmt.Errorf("staging root: %w", err)
	}
	if err := unix.PivotRoot(".", "."+oldRoot); err != nil {
		return fmt.Errorf("pivoting to the staging root: %w", err)
	}
	for _, b := range binds {
		if err := bindInto(b); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(newRoot+"/proc", 0o555); err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	if err := unix.Mount("proc", newRoot+"/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mounting the jail's /proc: %w", err)
	}
	if err := unix.Unmount(oldRoot, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the host's root: %w", err)
	}
	if err := unix.Chdir(newRoot); err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	// Stack the staging root under the new one, then detach it.
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("pivoting to the jail root: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("detaching the staging root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	if err := unix.Mount("", "/", "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID|unix.MS_NODEV, ""); err != nil {
		return fmt.Errorf("making the jail root read-only: %w", err)
	}
	return nil
}

// bindInto binds the host path b.Src (under the old root) at b.At in the
// new root: read-only, nosuid and nodev, recursively, for files and
// directories; read-write and nosuid for device nodes.
func bindInto(b Bind) error {
	src := oldRoot + b.Src
	dst := newRoot + b.At
	st, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("%s: %w", b.At, err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	if st.IsDir() {
		err = os.Mkdir(dst, 0o755)
	} else {
		var f *os.File
		if f, err = os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644); err == nil {
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("jail root: %w", err)
	}
	if err := unix.Mount(src, dst, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("binding %s into the jail: %w", b.At, err)
	}
	attr := &unix.MountAttr{Attr_set: unix.MOUNT_ATTR_RDONLY | unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NODEV}
	if b.Dev {
		attr.Attr_set = unix.MOUNT_ATTR_NOSUID | unix.MOUNT_ATTR_NOEXEC
	}
	if err := unix.MountSetattr(-1, dst, unix.AT_RECURSIVE, attr); err != nil {
		return fmt.Errorf("restricting %s in the jail (needs Linux 5.12): %w", b.At, err)
	}
	return nil
}
