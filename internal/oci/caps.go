package oci

import (
	"fmt"
	"io"

	"isopod/internal/errdefs"
)

// MaxManifestBytes caps what isopod reads of an index, a manifest or an
// image config, from any source: they are read through a limit, never
// whole and then measured.
const MaxManifestBytes = 4 << 20

// TooLargeError is an index, a manifest or a config over
// MaxManifestBytes. It is errdefs.ErrInvalidArgument: no image isopod
// reads has one.
type TooLargeError struct {
	What string // "manifest sha256:...", "config of oci:dir"
	Size int64  // -1: known only to be over the cap
}

func (e *TooLargeError) Error() string {
	size := fmt.Sprintf("more than %d bytes", int64(MaxManifestBytes))
	if e.Size >= 0 {
		size = fmt.Sprintf("%d bytes", e.Size)
	}
	return fmt.Sprintf("%s is %s, over the cap of %d MiB on indexes, manifests and configs: "+
		"this is not an image isopod reads (or the source is damaged); use an image with an ordinary manifest and config",
		e.What, size, MaxManifestBytes>>20)
}

func (e *TooLargeError) Unwrap() error { return errdefs.ErrInvalidArgument }

// CheckSize refuses, before anything is read, an index, manifest or
// config whose descriptor gives a size over the cap (or a negative one).
func CheckSize(size int64, what string) error {
	if size > MaxManifestBytes || size < 0 {
		return &TooLargeError{What: what, Size: size}
	}
	return nil
}

// ReadCapped reads r to its end, refusing at once what runs past
// MaxManifestBytes.
func ReadCapped(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(CapReader(r, what))
	if err != nil {
		return nil, err
	}
	return b, nil
}

// CapReader passes r through and fails with a *TooLargeError on the read
// that goes past MaxManifestBytes.
func CapReader(r io.Reader, what string) io.Reader {
	return &capReader{r: io.LimitReader(r, MaxManifestBytes+1), what: what}
}

type capReader struct {
	r    io.Reader
	n    int64
	what string
}

func (c *capReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if c.n > MaxManifestBytes {
		return 0, &TooLargeError{What: c.what, Size: -1}
	}
	return n, err
}
