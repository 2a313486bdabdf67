package oci

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"isopod/integration/e2e"
)

// benchRounds is how many times each figure is measured; the median is
// reported.
const benchRounds = 3

// TestBenchImportAndTransfer measures, with ISOPOD_BENCH=1:
//
//   - importing a ~200 MB image of random data (4 gzip layers) against
//     its floor: the same layers fetched and flattened by
//     go-containerregistry (mutate.Extract), written out, and packed by
//     mksquashfs with the same options;
//   - pushing and pulling a stage holding 200 MB of random data against
//     a plain registry copy of the same blobs (crane.Copy between two
//     registries).
//
// Every registry is go-containerregistry's, in this process, on loopback.
func TestBenchImportAndTransfer(t *testing.T) {
	if !e2e.BenchEnabled() {
		t.Skip("a benchmark: set ISOPOD_BENCH=1")
	}
	e2e.RequireVM(t)
	reg := startRegistry(t)
	img := randomImage(t, 4, 50<<20)
	reg.push(t, "bench/img:v1", img)
	ref := reg.ref("bench/img:v1")

	var imp, floor []time.Duration
	for range benchRounds {
		start := time.Now()
		importOK(t, nil, ref, "bench")
		imp = append(imp, time.Since(start))
		ok(t, nil, "image", "rm", "bench")
		floor = append(floor, importFloor(t, ref))
	}
	mi, mf := median(imp), median(floor)
	t.Logf("BENCH import 200 MiB (4 gzip layers): isopod %v, floor (library fetch+flatten, untar, mksquashfs) %v, ratio %.2f (rounds %v / %v)",
		mi.Round(time.Millisecond), mf.Round(time.Millisecond), float64(mi)/float64(mf), imp, floor)

	m := ok(t, nil, "run", "--no-network", "--timeout-s", "600", "--commit-as", "bench/data", "--",
		"dd", "if=/dev/urandom", "of=/root/blob", "bs=1M", "count=200")
	id := e2e.Str(m, "stage_id")
	var pushT, pullT, copyT []time.Duration
	var sent, got int64
	for range benchRounds {
		// A registry of its own each round, so that every round sends
		// every blob.
		dest := startRegistry(t).ref("bench/stage")
		start := time.Now()
		p := ok(t, nil, "stage", "push", "--without-base", id, dest)
		pushT, sent = append(pushT, time.Since(start)), e2e.Num(t, p, "bytes_sent")
		// The blob record makes later pushes skip packing: forget it, so
		// every round packs.
		os.Remove(filepath.Join(e2e.HomeDir, "stages", id, "blob.json"))

		fresh := otherHome(t)
		start = time.Now()
		q := ok(t, fresh, "stage", "pull", dest+":"+id)
		pullT, got = append(pullT, time.Since(start)), e2e.Num(t, q, "bytes_received")

		other := startRegistry(t)
		start = time.Now()
		if err := crane.Copy(dest+":"+id, other.ref("copy/stage:"+id)); err != nil {
			t.Fatal(err)
		}
		copyT = append(copyT, time.Since(start))
	}
	mp, mq, mc := median(pushT), median(pullT), median(copyT)
	t.Logf("BENCH stage of 200 MiB random data (%.1f MiB as blobs): push %v (%.0f MiB/s), pull %v (%.0f MiB/s), crane.Copy of the same blobs %v (%.0f MiB/s); push/copy %.2f, pull/copy %.2f",
		float64(sent)/(1<<20), mp.Round(time.Millisecond), mibps(sent, mp), mq.Round(time.Millisecond), mibps(got, mq),
		mc.Round(time.Millisecond), mibps(sent, mc), float64(mp)/float64(mc), float64(mq)/float64(mc))
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func mibps(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

// randomImage is an image of layers layers, each files of random data
// adding up to size bytes, gzip-compressed at the fastest level.
func randomImage(t *testing.T, layers int, size int64) v1.Image {
	t.Helper()
	var ls []v1.Layer
	for i := range layers {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		r := rand.NewChaCha8([32]byte{byte(i), 42})
		const files = 10
		for f := range files {
			body := make([]byte, size/files)
			r.Read(body)
			w.WriteHeader(&tar.Header{Name: fmt.Sprintf("data/%d/%d.bin", i, f), Mode: 0o644, Size: int64(len(body)), Typeflag: tar.TypeReg})
			w.Write(body)
		}
		w.Close()
		raw := b.Bytes()
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil },
			tarball.WithCompressionLevel(gzip.BestSpeed))
		if err != nil {
			t.Fatal(err)
		}
		ls = append(ls, l)
	}
	img := image(t, "amd64", nil, "", ls...)
	return img
}

// importFloor is the least an import can do: fetch and flatten with the
// library, write the files, pack them.
func importFloor(t *testing.T, ref string) time.Duration {
	t.Helper()
	start := time.Now()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	img, err := remote.Image(r, remote.WithContext(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	root := filepath.Join(dir, "root")
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(root, filepath.Clean("/"+h.Name))
		switch h.Typeflag {
		case tar.TypeDir:
			os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			os.MkdirAll(filepath.Dir(p), 0o755)
			f, err := os.Create(p)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(f, tr)
			f.Close()
		}
	}
	out := filepath.Join(dir, "floor.sqfs")
	cmd := exec.Command("mksquashfs", root, out, "-noappend", "-mkfs-time", "0", "-comp", "zstd", "-Xcompression-level", "6",
		"-b", "131072", "-no-xattrs", "-no-exports", "-reproducible", "-quiet", "-no-progress", "-all-root")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("mksquashfs: %v\n%s", err, b)
	}
	return time.Since(start)
}
