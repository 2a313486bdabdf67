package workspace

import (
	"cmp"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Where a workspace's copy is made. Copying a tree creates a file per
// entry, which costs far more on a disk than in memory (on this project's
// test machines 0.66 ms a file against 0.03 on tmpfs, see BENCHMARKS.md);
// the copy and its image live for one run. So they go to a tmpfs when one
// has room for the largest copy the caps allow, twice (copy and image),
// with some to spare; else next to the run's VM directory.

// shmDir is the tmpfs a copy prefers.
const shmDir = "/dev/shm"

// shmSpare is what a copy leaves free on the tmpfs at its largest.
const shmSpare = 512 << 20

// shmBase is this user's private directory on the tmpfs.
func shmBase() string { return filepath.Join(shmDir, fmt.Sprintf("isopod-%d", os.Getuid())) }

// WorkDir returns the directory the workspace's copy is made under for
// the VM vmID, made private; fallback (the VM directory) when no tmpfs has
// room.
func WorkDir(vmID, fallback string, o Options) string {
	var st unix.Statfs_t
	if err := unix.Statfs(shmDir, &st); err != nil || st.Type != unix.TMPFS_MAGIC {
		return fallback
	}
	need := 2*cmp.Or(o.MaxBytes, DefaultMaxBytes) + shmSpare
	if int64(st.Bavail)*int64(st.Bsize) < need {
		return fallback
	}
	base := shmBase()
	if err := os.MkdirAll(base, 0o700); err != nil {
		return fallback
	}
	if fi, err := os.Lstat(base); err != nil || !fi.IsDir() || !ownedByMe(fi) {
		return fallback
	}
	dir := filepath.Join(base, vmID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		return fallback
	}
	return dir
}

// ownedByMe reports whether fi belongs to this process's user and no one
// else may write it.
func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t) // os.Lstat's, not x/sys's
	return ok && int(st.Uid) == os.Getuid() && fi.Mode().Perm()&0o022 == 0
}

// RemoveWork removes what a run (or one killed during it) left on the
// tmpfs under WorkDir. Idempotent.
func RemoveWork(vmID string) {
	if vmID != "" {
		os.RemoveAll(filepath.Join(shmBase(), vmID))
	}
}
