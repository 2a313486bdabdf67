//go:build linux

package workspace

import (
	"bytes"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
)

// benchTree makes a tree of about 50 MB in 5,000 files of random content
// (0 to 20 kB each), 100 per directory, two levels deep, and returns the
// file names.
func benchTree(b *testing.B) (string, []string) {
	b.Helper()
	dir := b.TempDir()
	r := rand.New(rand.NewPCG(1, 2))
	var names []string
	buf := make([]byte, 20_000)
	for i := range 5000 {
		rel := fmt.Sprintf("d%02d/e%d/f%04d.dat", i/500, i/100%5, i)
		n := r.IntN(len(buf) + 1) // 0..20 kB, 10 kB on average
		for j := range buf[:n] {
			buf[j] = byte(r.Uint32())
		}
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			b.Fatal(err)
		}
		if err := os.WriteFile(p, buf[:n], 0o644); err != nil {
			b.Fatal(err)
		}
		names = append(names, rel)
	}
	return dir, names
}

// BenchmarkPack copies and packs the 50 MB tree, reporting the two steps,
// with the work directory on the test's disk and, where there is one, on
// tmpfs (/dev/shm).
//
//	go test -run '^$' -bench Pack -benchtime 5x ./internal/workspace
func BenchmarkPack(b *testing.B) {
	needTools(b, "mksquashfs")
	dir, _ := benchTree(b)
	works := map[string]string{"disk": b.TempDir()}
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		shm, err := os.MkdirTemp("/dev/shm", "workspace-bench-")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { os.RemoveAll(shm) })
		works["tmpfs"] = shm
	}
	for _, name := range keys(works) {
		b.Run("work="+name, func(b *testing.B) {
			var copyT, packT float64
			var size int64
			for b.Loop() {
				f, err := os.Open(dir)
				if err != nil {
					b.Fatal(err)
				}
				tr, err := Pack(b.Context(), f, works[name], Options{})
				f.Close()
				if err != nil {
					b.Fatal(err)
				}
				copyT += float64(tr.CopyTime.Milliseconds())
				packT += float64(tr.PackTime.Milliseconds())
				fi, _ := os.Stat(tr.Image)
				size = fi.Size()
				if tr.Files < 5000 || tr.Bytes < 45<<20 {
					b.Fatalf("copied %d entries, %d bytes", tr.Files, tr.Bytes)
				}
				tr.Close()
			}
			b.ReportMetric(copyT/float64(b.N), "copy-ms")
			b.ReportMetric(packT/float64(b.N), "pack-ms")
			b.ReportMetric(float64(size)/(1<<20), "image-MiB")
		})
	}
}

// BenchmarkPatch makes a patch of 500 changes to the 50 MB tree: 300
// files rewritten in part, 100 added, 100 deleted.
func BenchmarkPatch(b *testing.B) {
	needTools(b, "mksquashfs", "git")
	dir, names := benchTree(b)
	tr := mustPack(b, dir, Options{})
	contents := b.TempDir()
	var changes []Change
	for i, rel := range names[:400] {
		old, err := os.ReadFile(filepath.Join(dir, rel))
		if err != nil {
			b.Fatal(err)
		}
		c := filepath.Join(contents, fmt.Sprint(i))
		if err := os.WriteFile(c, append(old[:len(old)/2:len(old)/2], "changed"...), 0o644); err != nil {
			b.Fatal(err)
		}
		kind := Modified
		if i >= 300 {
			kind, rel = Added, "new/"+rel
		}
		changes = append(changes, Change{Path: rel, Kind: kind, Mode: fs.FileMode(0o644), Content: c})
	}
	for _, rel := range names[400:500] {
		changes = append(changes, Change{Path: rel, Kind: Deleted})
	}
	var size int
	for b.Loop() {
		var w bytes.Buffer
		s, err := tr.Patch(b.Context(), changes, &w)
		if err != nil {
			b.Fatal(err)
		}
		if s.Modified != 300 || s.Added != 100 || s.Deleted != 100 {
			b.Fatalf("stats %+v", s)
		}
		size = w.Len()
	}
	b.ReportMetric(float64(size)/(1<<20), "patch-MiB")
}
