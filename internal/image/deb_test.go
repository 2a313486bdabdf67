package image

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// tarOf makes a tar archive of files (names sorted, each under "./") with a
// directory entry for "./" first, the way dpkg-deb writes them.
func tarOf(t testing.TB, files map[string]string) []byte {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	if err := tw.WriteHeader(&tar.Header{Name: "./", Mode: 0o755, Typeflag: tar.TypeDir}); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		body := files[name]
		if err := tw.WriteHeader(&tar.Header{Name: "./" + name, Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// compress compresses data for a member or file whose name ends in suffix:
// "" (none), ".gz", ".xz" or ".zst".
func compress(t testing.TB, suffix string, data []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	var w io.WriteCloser
	var err error
	switch suffix {
	case "":
		return data
	case ".gz":
		w = gzip.NewWriter(&b)
	case ".xz":
		w, err = xz.NewWriter(&b)
	case ".zst":
		w, err = zstd.NewWriter(&b)
	default:
		t.Fatalf("no compressor for %q", suffix)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// arMember is one ar member: its header, data and padding.
func arMember(name string, data []byte) []byte {
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "%-16s%-12d%-6d%-6d%-8s%-10d`\n", name+"/", 0, 0, 0, "100644", len(data))
	buf.Write(data)
	if len(data)%2 == 1 {
		buf.WriteByte('\n')
	}
	return buf.Bytes()
}

// makeDebWith writes dir/name, a .deb with the control file control and
// the data files, both members compressed as suffix says.
func makeDebWith(t testing.TB, dir, name, control, suffix string, files map[string]string) string {
	t.Helper()
	buf := bytes.NewBufferString("!<arch>\n")
	buf.Write(arMember("debian-binary", []byte("2.0\n")))
	buf.Write(arMember("control.tar"+suffix, compress(t, suffix, tarOf(t, map[string]string{"control": control}))))
	buf.Write(arMember("data.tar"+suffix, compress(t, suffix, tarOf(t, files))))
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// makeDeb writes a small .deb (gzip payloads) holding files.
func makeDeb(t testing.TB, dir, pkg, version string, files map[string]string) string {
	t.Helper()
	control := "Package: " + pkg + "\nVersion: " + version + "\nArchitecture: amd64\nDescription: test package\n"
	return makeDebWith(t, dir, pkg+"_"+version+"_amd64.deb", control, ".gz", files)
}

func TestWalkDebDataPayloads(t *testing.T) {
	files := map[string]string{"bin/busybox": "BUSYBOX", "usr/share/doc/busybox/copyright": "GPL-2"}
	control := "Package: busybox-static\nVersion: 1:1.37.0-6+b5\nArchitecture: amd64\nDepends: libc6 (>= 2.34)\nDescription: one\n two\n"
	for _, suffix := range []string{"", ".gz", ".xz", ".zst"} {
		t.Run("data.tar"+suffix, func(t *testing.T) {
			deb := makeDebWith(t, t.TempDir(), "p.deb", control, suffix, files)
			got := map[string]string{}
			err := walkDebData(deb, func(name string, h *tar.Header, r io.Reader) error {
				if h.Typeflag != tar.TypeReg {
					return nil
				}
				b, err := io.ReadAll(r)
				got[name] = string(b)
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(files) {
				t.Errorf("got files %v; want %v", got, files)
			}
			for name, want := range files {
				if got[name] != want {
					t.Errorf("%s: got %q; want %q", name, got[name], want)
				}
			}
			ctl, err := debControl(deb)
			if err != nil {
				t.Fatal(err)
			}
			if ctl.Package != "busybox-static" || ctl.Version.Epoch != 1 || ctl.Version.String() != "1:1.37.0-6+b5" {
				t.Errorf("control: package %q version %+v", ctl.Package, ctl.Version)
			}
			if len(ctl.Depends.Relations) != 1 || ctl.Depends.Relations[0].Possibilities[0].Name != "libc6" {
				t.Errorf("depends: %+v", ctl.Depends)
			}
		})
	}
}

func TestWalkDebDataStopsOnError(t *testing.T) {
	deb := makeDeb(t, t.TempDir(), "p", "1.0-1", map[string]string{"a": "1", "b": "2"})
	stop := errors.New("stop")
	var seen []string
	err := walkDebData(deb, func(name string, h *tar.Header, r io.Reader) error {
		seen = append(seen, name)
		return stop
	})
	if !errors.Is(err, stop) || !strings.Contains(err.Error(), "data.tar.gz") {
		t.Errorf("got %v; want the callback's error naming the member", err)
	}
	if len(seen) != 1 || seen[0] != "a" {
		t.Errorf("visited %v after the error; want only [a]", seen)
	}
}

func TestDebRejectsNonDeb(t *testing.T) {
	dir := t.TempDir()
	noVersion := makeDebWith(t, dir, "noversion.deb", "Package: p\nArchitecture: amd64\n", ".gz", map[string]string{"a": "1"})
	tests := []struct {
		name string
		data []byte
	}{
		{"zip", []byte("PK\x03\x04 not an ar archive")},
		{"empty", nil},
		{"ar without debian-binary", append([]byte("!<arch>\n"), arMember("data.tar", tarOf(t, nil))...)},
		{"unknown format version", append(append([]byte("!<arch>\n"), arMember("debian-binary", []byte("3.0\n"))...), arMember("data.tar", tarOf(t, nil))...)},
		{"truncated header", []byte("!<arch>\ndebian-binary/  0")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".deb")
			if err := os.WriteFile(p, tt.data, 0o644); err != nil {
				t.Fatal(err)
			}
			err := walkDebData(p, func(string, *tar.Header, io.Reader) error { return nil })
			if !errors.Is(err, ErrNotDeb) {
				t.Errorf("walkDebData: got %v; want a refusal", err)
			}
			if _, err := debControl(p); err == nil {
				t.Error("debControl accepted it")
			}
		})
	}
	if _, err := debControl(noVersion); err == nil || !strings.Contains(err.Error(), "Version") {
		t.Errorf("control without Version: got %v; want a refusal naming the field", err)
	}
	if _, err := debControl(filepath.Join(dir, "missing.deb")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("missing file: got %v; want not-exist", err)
	}
}

func TestRealDebControl(t *testing.T) {
	ctl, err := debControl(needRealDeb(t))
	if err != nil {
		t.Fatal(err)
	}
	if ctl.Package != KernelPin.Package || ctl.Version.String() != KernelPin.Version || ctl.Architecture.String() != "amd64" {
		t.Errorf("control: %s %s %s; want %s %s amd64", ctl.Package, ctl.Version, ctl.Architecture, KernelPin.Package, KernelPin.Version)
	}
}
