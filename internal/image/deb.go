package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"pault.ag/go/debian/deb"
)

// ErrNotDeb is a file that cannot be read as a Debian package.
var ErrNotDeb = errors.New("is not a readable Debian package")

// openDeb opens the .deb at path with pault.ag/go/debian: its control file
// is parsed and its data member is ready to be read as a tar stream. The
// caller calls the returned function when done. A file that is not one
// is ErrNotDeb.
func openDeb(path string) (*deb.Deb, func(), error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("opening package: %w", err)
	}
	d, err := deb.Load(f, path)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("%s %w: %w", path, ErrNotDeb, err)
	}
	return d, func() {
		d.Close()
		f.Close()
	}, nil
}

// walkDebData streams the data.tar.* member of the .deb at path, calling fn
// for every tar entry. Names are given without a leading "./" or "/".
func walkDebData(path string, fn func(name string, h *tar.Header, r io.Reader) error) error {
	d, done, err := openDeb(path)
	if err != nil {
		return err
	}
	defer done()
	if err := walkTar(d.Data, fn); err != nil {
		return fmt.Errorf("%s: data.%s: %w", path, d.DataExt, err)
	}
	return nil
}

func walkTar(tr *tar.Reader, fn func(name string, h *tar.Header, r io.Reader) error) error {
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w", err)
		}
		name := strings.TrimPrefix(strings.TrimPrefix(h.Name, "./"), "/")
		if name == "" {
			continue
		}
		if err := fn(name, h, tr); err != nil {
			return err
		}
	}
}

// debControl returns the control file of the .deb at path.
func debControl(path string) (deb.Control, error) {
	d, done, err := openDeb(path)
	if err != nil {
		return deb.Control{}, err
	}
	defer done()
	return d.Control, nil
}

// decompressXZ opens an xz stream with the decoder .deb members are read
// with.
func decompressXZ(r io.Reader) (io.ReadCloser, error) {
	return deb.DecompressorFor(".xz")(r)
}
