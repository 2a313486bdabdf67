package image

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"

	"github.com/ulikunitz/xz"
)

// arMember is one member of an ar archive.
type arMember struct {
	Name string
	Size int64
}

// arReader walks the members of an ar archive (the container of a .deb).
type arReader struct {
	r      *bufio.Reader
	remain int64
	pad    bool
}

func newArReader(r io.Reader) (*arReader, error) {
	br := bufio.NewReader(r)
	var sig [8]byte
	if _, err := io.ReadFull(br, sig[:]); err != nil {
		return nil, fmt.Errorf("reading ar signature: %w", err)
	}
	if string(sig[:]) != "!<arch>\n" {
		return nil, errors.New("not an ar archive (a .deb starts with \"!<arch>\")")
	}
	return &arReader{r: br}, nil
}

// Next skips to the next member header. It returns io.EOF after the last.
func (a *arReader) Next() (arMember, error) {
	if _, err := io.CopyN(io.Discard, a.r, a.remain); err != nil {
		return arMember{}, fmt.Errorf("skipping ar member: %w", err)
	}
	if a.pad {
		if _, err := a.r.Discard(1); err != nil {
			return arMember{}, fmt.Errorf("skipping ar padding: %w", err)
		}
	}
	var h [60]byte
	n, err := io.ReadFull(a.r, h[:])
	if err == io.EOF || (err == io.ErrUnexpectedEOF && n == 1 && h[0] == '\n') {
		return arMember{}, io.EOF
	}
	if err != nil {
		return arMember{}, fmt.Errorf("reading ar header: %w", err)
	}
	if string(h[58:60]) != "`\n" {
		return arMember{}, errors.New("corrupt ar header (bad terminator)")
	}
	name := strings.TrimRight(strings.TrimSpace(string(h[0:16])), "/")
	size, err := strconv.ParseInt(strings.TrimSpace(string(h[48:58])), 10, 64)
	if err != nil || size < 0 {
		return arMember{}, fmt.Errorf("corrupt ar header: size %q", h[48:58])
	}
	a.remain = size
	a.pad = size%2 == 1
	return arMember{Name: name, Size: size}, nil
}

// Read reads the current member's content.
func (a *arReader) Read(p []byte) (int, error) {
	if a.remain <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > a.remain {
		p = p[:a.remain]
	}
	n, err := a.r.Read(p)
	a.remain -= int64(n)
	if err == io.EOF && a.remain > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// debMembers lists the member names of a .deb.
func debMembers(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ar, err := newArReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	var names []string
	for {
		m, err := ar.Next()
		if err == io.EOF {
			return names, nil
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		names = append(names, m.Name)
	}
}

// walkDebData streams the data.tar.* member of the .deb at path, calling fn
// for every tar entry. Names are given without a leading "./" or "/".
func walkDebData(path string, fn func(name string, h *tar.Header, r io.Reader) error) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("opening package: %w", err)
	}
	defer f.Close()
	ar, err := newArReader(f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	for {
		m, err := ar.Next()
		if err == io.EOF {
			return fmt.Errorf("%s: no data.tar member: not a Debian package", path)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !strings.HasPrefix(m.Name, "data.tar") {
			continue
		}
		dr, closeFn, err := decompressor(m.Name, ar)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		err = walkTar(dr, fn)
		if cerr := closeFn(); err == nil && cerr != nil {
			err = cerr
		}
		if err != nil {
			return fmt.Errorf("%s: %s: %w", path, m.Name, err)
		}
		return nil
	}
}

func walkTar(r io.Reader, fn func(name string, h *tar.Header, r io.Reader) error) error {
	tr := tar.NewReader(r)
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

// decompressor picks the decompression for a data.tar member by its suffix.
// xz and gzip are decoded in Go; zstd (used by Ubuntu) through the zstd tool.
func decompressor(name string, r io.Reader) (io.Reader, func() error, error) {
	nop := func() error { return nil }
	switch {
	case name == "data.tar":
		return r, nop, nil
	case strings.HasSuffix(name, ".xz"):
		xr, err := xz.NewReader(bufio.NewReaderSize(r, 1<<20))
		if err != nil {
			return nil, nil, fmt.Errorf("opening xz stream: %w", err)
		}
		return xr, nop, nil
	case strings.HasSuffix(name, ".gz"):
		gr, err := gzip.NewReader(r)
		if err != nil {
			return nil, nil, fmt.Errorf("opening gzip stream: %w", err)
		}
		return gr, gr.Close, nil
	case strings.HasSuffix(name, ".zst"):
		bin, err := exec.LookPath("zstd")
		if err != nil {
			return nil, nil, fmt.Errorf("%s needs the zstd tool (apt-get install zstd)", name)
		}
		cmd := exec.Command(bin, "-dc")
		cmd.Stdin = r
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, nil, fmt.Errorf("starting zstd: %w", err)
		}
		return out, func() error {
			io.Copy(io.Discard, out)
			if err := cmd.Wait(); err != nil {
				return fmt.Errorf("zstd -d: %w: %s", err, strings.TrimSpace(stderr.String()))
			}
			return nil
		}, nil
	}
	return nil, nil, fmt.Errorf("unsupported package payload %q", name)
}

// debControl returns the fields of a .deb's control file.
func debControl(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening package: %w", err)
	}
	defer f.Close()
	ar, err := newArReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for {
		m, err := ar.Next()
		if err == io.EOF {
			return nil, fmt.Errorf("%s: no control.tar member: not a Debian package", path)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		if !strings.HasPrefix(m.Name, "control.tar") {
			continue
		}
		dr, closeFn, err := decompressor("data"+strings.TrimPrefix(m.Name, "control"), ar)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		var fields map[string]string
		errDone := errors.New("done")
		err = walkTar(dr, func(name string, h *tar.Header, r io.Reader) error {
			if name != "control" {
				return nil
			}
			b, err := io.ReadAll(io.LimitReader(r, 1<<20))
			if err != nil {
				return err
			}
			fields = parseStanza(string(b))
			return errDone
		})
		closeFn()
		if err != nil && err != errDone {
			return nil, fmt.Errorf("%s: %s: %w", path, m.Name, err)
		}
		if fields == nil {
			return nil, fmt.Errorf("%s: control file missing", path)
		}
		return fields, nil
	}
}
