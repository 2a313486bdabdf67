package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// A live VM's scratch disk is committed from a snapshot: a copy of its
// image taken while the guest holds the filesystem frozen, kept in the
// store's staging area (a locked temporary directory that GC leaves alone
// while it is locked and removes once it is not). Commit then treats the
// copy exactly as a stopped run's scratch disk.

// Snapshot is a copy of a scratch disk's image in the store's staging
// area. Close removes it.
type Snapshot struct {
	// Path is the copy, to give Commit as CommitRequest.Scratch.
	Path string
	// Reflinked says the copy shares the original's blocks (FICLONE)
	// rather than being a sparse copy of its data.
	Reflinked bool
	dir       *commitDir
	s         *Store
}

// snapshotFile is a snapshot's file in its directory.
const snapshotFile = "scratch.ext4"

// SnapshotLayer copies the disk image at src into the staging area: a
// reflink where the filesystem allows it, else a sparse copy of its data
// (not fsynced: the copy lives only until the commit is done).
func (s *Store) SnapshotLayer(ctx context.Context, src string) (*Snapshot, error) {
	dir, err := s.openCommitDir("snapshot")
	if err != nil {
		return nil, err
	}
	sn := &Snapshot{Path: filepath.Join(dir.path, snapshotFile), dir: dir, s: s}
	ok, err := reflink(src, sn.Path)
	if err == nil && !ok {
		_, err = copySparseSync(ctx, src, sn.Path, false)
	}
	if err != nil {
		sn.Close()
		return nil, fmt.Errorf("copying the scratch disk: %w", err)
	}
	sn.Reflinked = ok
	return sn, nil
}

// Close removes the snapshot (nothing, once committed).
func (sn *Snapshot) Close() { sn.dir.close(sn.s.log) }

// CommitSnapshot commits sn as Commit commits req.Scratch, moving the
// snapshot's file into the new stage instead of copying it; sn is spent
// either way (Close it).
func (s *Store) CommitSnapshot(ctx context.Context, sn *Snapshot, req CommitRequest) (Meta, CommitTiming, error) {
	req.Scratch = sn.Path
	return s.commit(ctx, req, true)
}

// adoptFile moves src to dst (both in the store), fsyncs it and returns
// the bytes it allocates.
func adoptFile(src, dst string) (int64, error) {
	if err := os.Rename(src, dst); err != nil {
		return 0, fmt.Errorf("moving the snapshot into the stage: %w", err)
	}
	f, err := os.Open(dst)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return 0, fmt.Errorf("syncing the layer: %w", err)
	}
	return allocatedBytes(f)
}

// reflink makes dst a clone of src sharing its blocks. It reports false,
// leaving no dst, when the filesystem cannot clone.
func reflink(src, dst string) (bool, error) {
	in, err := os.Open(src)
	if err != nil {
		return false, err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return false, err
	}
	cerr := unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err := out.Close(); err != nil && cerr == nil {
		return false, err
	}
	if cerr != nil {
		if err := os.Remove(dst); err != nil {
			return false, err
		}
		return false, nil
	}
	return true, nil
}
