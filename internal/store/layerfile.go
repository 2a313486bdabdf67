package store

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
)

const (
	// blockSize is the unit of the canonical layer encoding and of the
	// sparse copy: a block of all zeros is treated as a hole.
	blockSize = 4096
	// chunkSize is how much is read at a time.
	chunkSize = 1 << 20
	// hashDomain starts every stage hash, versioning the encoding.
	hashDomain = "isopod-stage-v1\x00"
)

var zeroBlock = make([]byte, blockSize)

// dataRegions returns the regions of f that may hold data, as [start, end)
// pairs aligned to blockSize, using SEEK_DATA/SEEK_HOLE. A filesystem that
// cannot report holes yields one region covering the whole file.
func dataRegions(f *os.File, size int64) ([][2]int64, error) {
	fd := int(f.Fd())
	var out [][2]int64
	off := int64(0)
	for off < size {
		start, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break
		}
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP) {
			return [][2]int64{{0, size}}, nil
		}
		if err != nil {
			return nil, fmt.Errorf("seeking data in %s: %w", f.Name(), err)
		}
		end, err := unix.Seek(fd, start, unix.SEEK_HOLE)
		if err != nil {
			return nil, fmt.Errorf("seeking hole in %s: %w", f.Name(), err)
		}
		if end > size {
			end = size
		}
		start -= start % blockSize
		if n := len(out); n > 0 && start < out[n-1][1] {
			// Two regions share a block (filesystem blocks smaller than
			// blockSize): merge them.
			out[n-1][1] = end
		} else {
			out = append(out, [2]int64{start, end})
		}
		off = end
	}
	for i := range out {
		if r := out[i][1] % blockSize; r != 0 {
			out[i][1] += blockSize - r
		}
		if out[i][1] > size {
			out[i][1] = size
		}
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("rewinding %s: %w", f.Name(), err)
	}
	return out, nil
}

// walkData calls fn for every maximal run of consecutive blocks of f that
// are not all zeros, in offset order. data is only valid during the call
// and holds whole blocks (the last block of the file may be short).
func walkData(ctx context.Context, f *os.File, size int64, fn func(off int64, data []byte) error) error {
	regions, err := dataRegions(f, size)
	if err != nil {
		return err
	}
	buf := make([]byte, chunkSize)
	for _, r := range regions {
		for off := r[0]; off < r[1]; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := int64(len(buf))
			if r[1]-off < n {
				n = r[1] - off
			}
			chunk := buf[:n]
			if _, err := f.ReadAt(chunk, off); err != nil && !errors.Is(err, io.EOF) {
				return fmt.Errorf("reading %s: %w", f.Name(), err)
			}
			runStart := -1
			for b := 0; b < len(chunk); b += blockSize {
				e := min(b+blockSize, len(chunk))
				if bytes.Equal(chunk[b:e], zeroBlock[:e-b]) {
					if runStart >= 0 {
						if err := fn(off+int64(runStart), chunk[runStart:b]); err != nil {
							return err
						}
						runStart = -1
					}
					continue
				}
				if runStart < 0 {
					runStart = b
				}
			}
			if runStart >= 0 {
				if err := fn(off+int64(runStart), chunk[runStart:]); err != nil {
					return err
				}
			}
			off += n
		}
	}
	return nil
}

// DigestPrefix starts a stage's full digest (Meta.Digest).
const DigestPrefix = "blake3:"

// HashLayer returns the stage id and full digest of the layer at path over
// the given parent and base flavor, and the layer's size. The digest is
// DigestPrefix and 64 hex digits of BLAKE3 over a canonical encoding that
// does not depend on how the file is stored (holes and zero blocks hash the
// same); the id is "st-" and its first 16 digits:
//
//	"isopod-stage-v1\0" parent "\0" flavor "\0" size(u64le)
//	then for every non-zero 4 KiB block: offset(u64le) bytes
//
// The parent and flavor are part of it because the same layer means a
// different filesystem over a different chain.
func HashLayer(ctx context.Context, path, parent, flavor string) (id, digest string, size int64, err error) {
	f, err := os.Open(path)
	if err != nil {
		return "", "", 0, fmt.Errorf("opening scratch layer: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return "", "", 0, fmt.Errorf("stat scratch layer: %w", err)
	}
	if !st.Mode().IsRegular() {
		return "", "", 0, fmt.Errorf("scratch layer %s is not a regular file: %w", path, errdefs.ErrInvalidArgument)
	}
	size = st.Size()
	h := blake3.New()
	var hdr [8]byte
	h.WriteString(hashDomain + parent + "\x00" + flavor + "\x00")
	binary.LittleEndian.PutUint64(hdr[:], uint64(size))
	h.Write(hdr[:])
	err = walkData(ctx, f, size, func(off int64, data []byte) error {
		for b := 0; b < len(data); b += blockSize {
			binary.LittleEndian.PutUint64(hdr[:], uint64(off+int64(b)))
			h.Write(hdr[:])
			h.Write(data[b:min(b+blockSize, len(data))])
		}
		return nil
	})
	if err != nil {
		return "", "", 0, fmt.Errorf("hashing scratch layer: %w", err)
	}
	sum := h.Sum(nil)
	return "st-" + hex.EncodeToString(sum[:8]), DigestPrefix + hex.EncodeToString(sum), size, nil
}

// copySparse copies src to a new file dst, writing only blocks that are not
// all zeros, and fsyncs it. It returns the bytes dst allocates on disk.
func copySparse(ctx context.Context, src, dst string) (allocated int64, err error) {
	return copySparseSync(ctx, src, dst, true)
}

// copySparseSync is copySparse, fsyncing dst only when sync is set.
func copySparseSync(ctx context.Context, src, dst string, sync bool) (allocated int64, err error) {
	in, err := os.Open(src)
	if err != nil {
		return 0, fmt.Errorf("opening scratch layer: %w", err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil {
		return 0, fmt.Errorf("stat scratch layer: %w", err)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, fmt.Errorf("creating layer copy: %w", err)
	}
	defer func() {
		if cerr := out.Close(); cerr != nil && err == nil {
			err = fmt.Errorf("closing layer copy: %w", cerr)
		}
	}()
	err = walkData(ctx, in, st.Size(), func(off int64, data []byte) error {
		_, werr := out.WriteAt(data, off)
		return werr
	})
	if err != nil {
		return 0, fmt.Errorf("copying layer: %w", err)
	}
	if err := out.Truncate(st.Size()); err != nil {
		return 0, fmt.Errorf("sizing layer copy: %w", err)
	}
	if sync {
		if err := out.Sync(); err != nil {
			return 0, fmt.Errorf("syncing layer copy: %w", err)
		}
	}
	return allocatedBytes(out)
}

// allocatedBytes returns the disk space f occupies.
func allocatedBytes(f *os.File) (int64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return 0, fmt.Errorf("stat %s: %w", f.Name(), err)
	}
	return st.Blocks * 512, nil
}

// syncDir fsyncs a directory so renames and creations in it are durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening %s for sync: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", dir, err)
	}
	return nil
}
