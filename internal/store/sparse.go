package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"

	"isopod/internal/errdefs"
)

// The sparse layer stream is how a stage's layer travels: its apparent
// size, then every run of blocks that are not all zeros with its offset.
// Holes (and zero blocks) are not sent and stay holes on arrival.
//
//	"isopod-layer-v1\n"
//	size  u64le
//	{ offset u64le, length u64le, data[length] }   offsets increasing, 4 KiB aligned
//	offset = 2^64-1, length = 0                    end
//
// The stream is not compressed here; the registry blob is (see
// internal/transfer).
const sparseMagic = "isopod-layer-v1\n"

// sparseEnd is the offset that ends a stream.
const sparseEnd = ^uint64(0)

// MaxLayerBytes bounds a received layer's apparent size: the largest
// scratch disk a run may have.
const MaxLayerBytes int64 = 64 << 30

// EncodeLayer writes stage id's layer as a sparse layer stream.
func (s *Store) EncodeLayer(ctx context.Context, id string, w io.Writer) error {
	if err := EncodeFile(ctx, s.LayerPath(id), w); err != nil {
		return fmt.Errorf("stage %s: %w", id, err)
	}
	return nil
}

// EncodeFile writes the layer file at path as a sparse layer stream.
func EncodeFile(ctx context.Context, path string, w io.Writer) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	bw := bufio.NewWriterSize(w, 1<<20)
	var hdr [16]byte
	bw.WriteString(sparseMagic)
	binary.LittleEndian.PutUint64(hdr[:8], uint64(st.Size()))
	bw.Write(hdr[:8])
	err = walkData(ctx, f, st.Size(), func(off int64, data []byte) error {
		binary.LittleEndian.PutUint64(hdr[:8], uint64(off))
		binary.LittleEndian.PutUint64(hdr[8:], uint64(len(data)))
		bw.Write(hdr[:])
		_, err := bw.Write(data)
		return err
	})
	if err != nil {
		return fmt.Errorf("encoding: %w", err)
	}
	binary.LittleEndian.PutUint64(hdr[:8], sparseEnd)
	binary.LittleEndian.PutUint64(hdr[8:], 0)
	bw.Write(hdr[:])
	return bw.Flush()
}

// badStream is a refusal of a received layer stream.
func badStream(format string, args ...any) error {
	return fmt.Errorf("layer stream: "+format+": %w", append(args, errdefs.ErrInvalidArgument)...)
}

// DecodeLayer writes the sparse layer stream r to a new file dst, leaving
// holes where nothing (or only zeros) was sent, and returns its size. A
// stream that is malformed, runs backwards, overlaps itself, goes past its
// size or carries more than maxData bytes of data is refused.
func DecodeLayer(ctx context.Context, r io.Reader, dst string, maxData int64) (size int64, err error) {
	br := bufio.NewReaderSize(r, 1<<20)
	magic := make([]byte, len(sparseMagic))
	if _, err := io.ReadFull(br, magic); err != nil || string(magic) != sparseMagic {
		return 0, badStream("not an isopod layer stream")
	}
	var hdr [16]byte
	if _, err := io.ReadFull(br, hdr[:8]); err != nil {
		return 0, badStream("truncated header")
	}
	usize := binary.LittleEndian.Uint64(hdr[:8])
	if usize > uint64(MaxLayerBytes) {
		return 0, badStream("apparent size %d is over %d", usize, MaxLayerBytes)
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return 0, fmt.Errorf("creating layer: %w", err)
	}
	defer func() {
		if cerr := out.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()
	buf := make([]byte, chunkSize)
	var next, data uint64
	for {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return 0, badStream("truncated run header")
		}
		off, n := binary.LittleEndian.Uint64(hdr[:8]), binary.LittleEndian.Uint64(hdr[8:])
		if off == sparseEnd && n == 0 {
			break
		}
		if off < next || off%blockSize != 0 || n == 0 || n > usize || off > usize-n {
			return 0, badStream("run [%d, +%d) is out of order, unaligned or past the size %d", off, n, usize)
		}
		if data += n; maxData > 0 && data > uint64(maxData) {
			return 0, badStream("more than %d bytes of data", maxData)
		}
		if err := copyRun(br, out, int64(off), int64(n), buf); err != nil {
			return 0, err
		}
		next = off + n
	}
	if _, err := br.ReadByte(); !errors.Is(err, io.EOF) {
		return 0, badStream("data after the end")
	}
	if err := out.Truncate(int64(usize)); err != nil {
		return 0, fmt.Errorf("sizing layer: %w", err)
	}
	if err := out.Sync(); err != nil {
		return 0, fmt.Errorf("syncing layer: %w", err)
	}
	return int64(usize), nil
}

// copyRun writes n bytes of r at off in out, skipping all-zero blocks.
func copyRun(r io.Reader, out *os.File, off, n int64, buf []byte) error {
	for n > 0 {
		c := min(n, int64(len(buf)))
		if _, err := io.ReadFull(r, buf[:c]); err != nil {
			return badStream("truncated data")
		}
		for b := int64(0); b < c; b += blockSize {
			e := min(b+blockSize, c)
			if bytes.Equal(buf[b:e], zeroBlock[:e-b]) {
				continue
			}
			if _, err := out.WriteAt(buf[b:e], off+b); err != nil {
				return fmt.Errorf("writing layer: %w", err)
			}
		}
		off, n = off+c, n-c
	}
	return nil
}
