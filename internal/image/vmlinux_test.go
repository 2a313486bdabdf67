package image

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fakeBzImage wraps payload in just enough of a bzImage's setup header.
func fakeBzImage(payload []byte) []byte {
	b := make([]byte, 5*512)
	b[0x1f1] = 4
	copy(b[0x202:], "HdrS")
	binary.LittleEndian.PutUint32(b[0x248:], 0)
	binary.LittleEndian.PutUint32(b[0x24c:], uint32(len(payload)))
	return append(b, payload...)
}

func gz(t *testing.T, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	w.Write(b)
	w.Close()
	return buf.Bytes()
}

// A kernel without a PVH entry point, or in a format isopod does not read,
// keeps booting from its bzImage: nothing is written and boots use vmlinuz.
func TestVMLinuxRefused(t *testing.T) {
	elfNoNote, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip(err)
	}
	for name, bz := range map[string][]byte{
		"no PVH note":    fakeBzImage(gz(t, elfNoNote)),
		"unknown format": fakeBzImage([]byte("BZh91AY&SY not read")),
		"not a bzImage":  []byte("MZ plain"),
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			src := filepath.Join(dir, "vmlinuz")
			if err := os.WriteFile(src, bz, 0o644); err != nil {
				t.Fatal(err)
			}
			if err := extractVMLinux(src, "sha", dir); !errors.Is(err, errNoPVH) {
				t.Errorf("extractVMLinux: %v; want errNoPVH", err)
			}
			if got := bootKernel(src, "sha"); got != src {
				t.Errorf("boot kernel %s; want the bzImage", got)
			}
		})
	}
}

// The pinned kernel, when this host has fetched it: its uncompressed
// kernel has a PVH entry point and is what boots use, for that vmlinuz only.
func TestVMLinuxOfTheFetchedKernel(t *testing.T) {
	home, _ := os.UserHomeDir()
	matches, _ := filepath.Glob(filepath.Join(home, ".isopod", "kernels", "*", "vmlinuz"))
	if len(matches) == 0 {
		t.Skip("no fetched kernel under ~/.isopod")
	}
	dir := t.TempDir()
	if err := extractVMLinux(matches[0], "the-deb", dir); err != nil {
		t.Fatalf("extractVMLinux: %v", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, VMLinuxName))
	if err != nil || !hasPVHEntry(b) {
		t.Fatalf("vmlinux: %d bytes, %v; want an ELF with a PVH entry", len(b), err)
	}
	src := filepath.Join(dir, "vmlinuz")
	if got := bootKernel(src, "the-deb"); got != filepath.Join(dir, VMLinuxName) {
		t.Errorf("boot kernel %s; want vmlinux", got)
	}
	if got := bootKernel(src, "another-deb"); got != src {
		t.Errorf("boot kernel for another package %s; want its vmlinuz", got)
	}
}
