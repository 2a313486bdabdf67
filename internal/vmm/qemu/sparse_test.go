package qemu

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// TestCopySparseLeavesZerosHoles: a snapshot's RAM file has a hole for
// every page of zeros of guest RAM, a hole of the source or a page written
// with zeros alike, and reads back byte for byte as the RAM.
func TestCopySparseLeavesZerosHoles(t *testing.T) {
	const page, size = sparsePage, 3*sparseChunk + 5*sparsePage
	fd, err := unix.MemfdCreate("ram", unix.MFD_CLOEXEC)
	if err != nil {
		t.Fatal(err)
	}
	ram := os.NewFile(uintptr(fd), "ram")
	defer ram.Close()
	if err := ram.Truncate(size); err != nil {
		t.Fatal(err)
	}
	// Pages by index: data, written zeros, and untouched (a hole).
	data := map[int64][]byte{
		0:                    bytes.Repeat([]byte{1}, page),   // the first page
		1:                    append(make([]byte, page-1), 2), // its last byte only
		5:                    bytes.Repeat([]byte{3}, 3*page), // a run of three
		sparseChunk/page - 1: bytes.Repeat([]byte{4}, 2*page), // across a chunk's end
		size/page - 1:        bytes.Repeat([]byte{5}, page),   // the last page
	}
	zeros := []int64{2, 3, 4, 8, 9, sparseChunk/page + 1, 2 * sparseChunk / page}
	for i, b := range data {
		if _, err := ram.WriteAt(b, i*page); err != nil {
			t.Fatal(err)
		}
	}
	for _, i := range zeros {
		if _, err := ram.WriteAt(make([]byte, page), i*page); err != nil {
			t.Fatal(err)
		}
	}
	dst := filepath.Join(t.TempDir(), "memory")
	if err := copySparse(dst, ram, size); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, size)
	if _, err := ram.ReadAt(want, 0); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(dst)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the file's bytes differ from the RAM's")
	}
	isData := map[int64]bool{}
	for i, b := range data {
		for j := range int64(len(b) / page) {
			isData[i+j] = true
		}
	}
	f, err := os.Open(dst)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for i := range int64(size / page) {
		next, err := unix.Seek(int(f.Fd()), i*page, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			next = size
		} else if err != nil {
			t.Fatal(err)
		}
		if inData := next == i*page; inData != isData[i] {
			t.Errorf("page %d: data %v; want %v", i, inData, isData[i])
		}
	}
}
