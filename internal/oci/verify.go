package oci

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"isopod/internal/errdefs"
)

// DigestError is content that does not match the digest or size it was
// named by: the source is damaged or was tampered with. It is
// errdefs.ErrFailedPrecondition.
type DigestError struct {
	What string // "layer 2/3", "config", "manifest"
	Want string // digest (or size) wanted
	Got  string
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("%s does not match its digest: want %s, got %s; the source is damaged or was tampered with, and nothing was kept: "+
		"push or save it again from an intact copy, or fetch it from another source", e.What, e.Want, e.Got)
}

func (e *DigestError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Verifier passes a stream through and checks, when it ends, that it had
// the size and sha256 digest it was named by. A stream that runs past its
// size or ends with another digest fails with a *DigestError on the read
// that shows it.
type Verifier struct {
	r    io.Reader
	h    hash.Hash
	n    int64
	want v1.Hash
	size int64 // -1: unknown
	what string
	done bool
}

// NewVerifier checks r against want and size (-1 when unknown). Only
// sha256 digests are accepted.
func NewVerifier(r io.Reader, want v1.Hash, size int64, what string) (*Verifier, error) {
	if want.Algorithm != "sha256" || len(want.Hex) != 64 {
		return nil, fmt.Errorf("%s: digest %q is not a sha256 digest: %w", what, want, errdefs.ErrNotSupported)
	}
	return &Verifier{r: r, h: sha256.New(), want: want, size: size, what: what}, nil
}

func (v *Verifier) Read(p []byte) (int, error) {
	n, err := v.r.Read(p)
	v.h.Write(p[:n])
	v.n += int64(n)
	if v.size >= 0 && v.n > v.size {
		return n, &DigestError{What: v.what, Want: fmt.Sprintf("%d bytes", v.size), Got: fmt.Sprintf("more than %d", v.size)}
	}
	switch {
	case err == io.EOF:
		if cerr := v.check(); cerr != nil {
			return n, cerr
		}
	case err != nil && v.size >= 0 && v.n == v.size:
		// A reader that checks digests itself fails at the end: say
		// what is wrong in our words when the bytes are indeed wrong.
		if cerr := v.check(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

func (v *Verifier) check() error {
	v.done = true
	if v.size >= 0 && v.n != v.size {
		return &DigestError{What: v.what, Want: fmt.Sprintf("%d bytes", v.size), Got: fmt.Sprintf("%d bytes", v.n)}
	}
	if got := hex.EncodeToString(v.h.Sum(nil)); got != v.want.Hex {
		return &DigestError{What: v.what, Want: v.want.String(), Got: "sha256:" + got}
	}
	return nil
}

// Drain reads what is left of the stream and returns the verdict: nil
// only when the whole stream had its digest.
func (v *Verifier) Drain() error {
	if _, err := io.Copy(io.Discard, v); err != nil {
		return err
	}
	if !v.done {
		return errors.New(v.what + ": stream ended without being checked")
	}
	return v.check()
}

// Bytes is how much has been read.
func (v *Verifier) Bytes() int64 { return v.n }

// CheckBytes verifies b against want.
func CheckBytes(b []byte, want v1.Hash, what string) error {
	if want.Algorithm != "sha256" {
		return fmt.Errorf("%s: digest %q is not a sha256 digest: %w", what, want, errdefs.ErrNotSupported)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != want.Hex {
		return &DigestError{What: what, Want: want.String(), Got: "sha256:" + got}
	}
	return nil
}
