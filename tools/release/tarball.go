package main

import (
	"archive/tar"
	"compress/gzip"
	"io"
	"os"
	"path"
	"sort"
)

// writeTarball makes the tarball: the same files as the packages (the
// licence as a plain file), under one top directory laid out as a prefix.
// Entries are sorted, owned by root, and dated at the commit.
func (r *Release) writeTarball(dst string, src func(file) string) error {
	fl := filesFor(formatTar)
	sort.Slice(fl, func(i, j int) bool { return fl[i].dst < fl[j].dst })
	return writeAtomic(dst, func(out *os.File) error {
		zw, err := gzip.NewWriterLevel(out, gzip.BestCompression)
		if err != nil {
			return err
		}
		tw := tar.NewWriter(zw)
		hdr := func(name string, mode int64, typ byte, size int64) *tar.Header {
			return &tar.Header{
				Name: name, Mode: mode, Typeflag: typ, Size: size, ModTime: r.mtime(),
				Uname: "root", Gname: "root", Format: tar.FormatPAX,
			}
		}
		top := r.tarTop()
		written := map[string]bool{}
		var dir func(d string) error
		dir = func(d string) error {
			if d == "." || written[d] {
				return nil
			}
			if err := dir(path.Dir(d)); err != nil {
				return err
			}
			written[d] = true
			return tw.WriteHeader(hdr(path.Join(top, d)+"/", 0o755, tar.TypeDir, 0))
		}
		if err := tw.WriteHeader(hdr(top+"/", 0o755, tar.TypeDir, 0)); err != nil {
			return err
		}
		for _, f := range fl {
			if err := dir(path.Dir(f.dst)); err != nil {
				return err
			}
			if err := copyInto(tw, hdr(path.Join(top, f.dst), int64(f.mode), tar.TypeReg, 0), src(f)); err != nil {
				return err
			}
		}
		if err := tw.Close(); err != nil {
			return err
		}
		return zw.Close()
	})
}

// copyInto writes the file at p as h.
func copyInto(tw *tar.Writer, h *tar.Header, p string) error {
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	h.Size = st.Size()
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	_, err = io.Copy(tw, f)
	return err
}
