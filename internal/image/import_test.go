package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
	"isopod/internal/paths"
)

// importRegistry is go-containerregistry's registry on loopback; hook,
// when set, serves the requests it returns true for.
type importRegistry struct {
	host string
	mu   sync.Mutex
	hook func(w http.ResponseWriter, r *http.Request, inner http.Handler) bool
}

func startImportRegistry(t *testing.T) *importRegistry {
	t.Helper()
	r := &importRegistry{}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		hook := r.hook
		r.mu.Unlock()
		if hook == nil || !hook(w, req, inner) {
			inner.ServeHTTP(w, req)
		}
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *importRegistry) setHook(h func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hook = h
}

func (r *importRegistry) push(t *testing.T, ref string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag(r.host + "/" + ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(tag, img); err != nil {
		t.Fatal(err)
	}
	return tag.Name()
}

// tamper serves the blob digest with a byte changed.
func tamper(digest string) func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
	return func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/blobs/"+digest) {
			return false
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		b := rec.Body.Bytes()
		b[len(b)/2] ^= 0xff
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.WriteHeader(rec.Code)
		w.Write(b)
		return true
	}
}

// smallImage is a linux/amd64 image of one random layer; pad adds that
// many bytes to its config.
func smallImage(t *testing.T, pad int) v1.Image {
	t.Helper()
	img, err := random.Image(512, 1)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	if pad > 0 {
		cf.Config.Env = []string{"PAD=" + strings.Repeat("p", pad)}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	return img
}

func tryImport(t *testing.T, source string, stall oci.Stall) error {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = Import(ctx, p, ImportOptions{Source: source, Name: "x", Client: oci.Client{Stall: stall}, Logger: testLogger(t)})
	if err == nil {
		t.Errorf("import %s: accepted", source)
	}
	return err
}

func wantTooLarge(t *testing.T, what string, err error) {
	t.Helper()
	var te *oci.TooLargeError
	if !errors.As(err, &te) || errdefs.Class(err) != "invalid_argument" || !strings.Contains(err.Error(), "cap of 4 MiB") {
		t.Errorf("%s: %v; want an invalid-argument refusal naming the 4 MiB cap", what, err)
	}
}

func wantDigest(t *testing.T, what, want string, err error) {
	t.Helper()
	var de *oci.DigestError
	if !errors.As(err, &de) || errdefs.Class(err) != "failed_precondition" || (want != "" && de.Want != want) ||
		!strings.Contains(err.Error(), "want "+de.Want+", got "+de.Got) {
		t.Errorf("%s: %v; want a digest refusal naming the digest wanted (%s) and the one got", what, err, want)
	}
}

func TestImportFromARegistryCapsAndChecks(t *testing.T) {
	reg := startImportRegistry(t)
	img := smallImage(t, 0)
	src := reg.push(t, "test/small:v1", img)
	big := reg.push(t, "test/bigconfig:v1", smallImage(t, oci.MaxManifestBytes))
	wantTooLarge(t, "a config over the cap", tryImport(t, big, oci.Stall{}))

	// The image's own manifest, padded with white space past the cap.
	reg.setHook(func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/manifests/v1") {
			return false
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		w.Header().Set("Content-Type", rec.Header().Get("Content-Type"))
		w.Write(append(rec.Body.Bytes(), bytes.Repeat([]byte(" "), oci.MaxManifestBytes)...))
		return true
	})
	wantTooLarge(t, "a manifest over the cap", tryImport(t, src, oci.Stall{}))

	cd, _ := img.ConfigName()
	reg.setHook(tamper(cd.String()))
	wantDigest(t, "a damaged config", cd.String(), tryImport(t, src, oci.Stall{}))
	ls, _ := img.Layers()
	ld, _ := ls[0].Digest()
	reg.setHook(tamper(ld.String()))
	wantDigest(t, "a damaged layer", ld.String(), tryImport(t, src, oci.Stall{}))

	// A registry that stops sending, in a manifest or in a layer.
	stall := oci.Stall{Window: 300 * time.Millisecond}
	for _, part := range []string{"/manifests/", "/blobs/" + ld.String()} {
		reg.setHook(func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
			if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, part) {
				return false
			}
			w.WriteHeader(http.StatusOK)
			w.Write([]byte("{"))
			w.(http.Flusher).Flush()
			<-req.Context().Done()
			return true
		})
		start := time.Now()
		err := tryImport(t, src, stall)
		var se *oci.StallError
		if !errors.As(err, &se) || errdefs.Class(err) != "unavailable" || time.Since(start) > 10*stall.Window {
			t.Errorf("a registry stalled in %s: %v after %s; want a stall, class unavailable, in about %s", part, err, time.Since(start), stall.Window)
		}
	}
}

// writeLayout writes img as the layout dir's only image, tagged v1.
func writeLayout(t *testing.T, img v1.Image) (string, layout.Path) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "layout")
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	return dir, lp
}

// swell replaces path with a sparse file of size bytes of zeros.
func swell(t *testing.T, path string, size int64) {
	t.Helper()
	os.Remove(path)
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
}

// allocs is how many bytes fn allocates.
func allocs(fn func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	fn()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

func TestImportFromAnOCILayoutCapsAndChecks(t *testing.T) {
	img := smallImage(t, 0)
	md, _ := img.Digest()
	cd, _ := img.ConfigName()
	for _, c := range []struct {
		name   string
		damage func(dir string)
		want   func(t *testing.T, err error)
	}{
		{"a 300 MiB manifest", func(dir string) { swell(t, blobPath(dir, md), 300<<20) },
			func(t *testing.T, err error) { wantTooLarge(t, "a 300 MiB manifest", err) }},
		{"a 300 MiB index.json", func(dir string) { swell(t, filepath.Join(dir, "index.json"), 300<<20) },
			func(t *testing.T, err error) { wantTooLarge(t, "a 300 MiB index.json", err) }},
		{"a 300 MiB config", func(dir string) { swell(t, blobPath(dir, cd), 300<<20) },
			func(t *testing.T, err error) { wantDigest(t, "a 300 MiB config", "", err) }},
		{"a damaged config", func(dir string) {
			b, _ := os.ReadFile(blobPath(dir, cd))
			b[len(b)/2] ^= 0xff
			os.Chmod(blobPath(dir, cd), 0o644)
			os.WriteFile(blobPath(dir, cd), b, 0o644)
		}, func(t *testing.T, err error) { wantDigest(t, "a damaged config", cd.String(), err) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir, _ := writeLayout(t, img)
			c.damage(dir)
			var err error
			if n := allocs(func() { err = tryImport(t, "oci:"+dir+":v1", oci.Stall{}) }); n > 64<<20 {
				t.Errorf("the refusal allocated %d MiB; want the file read through the cap", n>>20)
			}
			c.want(t, err)
		})
	}
	// A config the manifest says is over the cap is not read.
	dir, _ := writeLayout(t, smallImage(t, oci.MaxManifestBytes))
	wantTooLarge(t, "a config over the cap", tryImport(t, "oci:"+dir+":v1", oci.Stall{}))
}

// rewriteArchive copies the docker-save archive src with fn applied to
// each entry's header and body.
func rewriteArchive(t *testing.T, src string, fn func(h *tar.Header, body []byte) []byte) string {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := src + ".rewritten"
	out, _ := os.Create(dst)
	defer out.Close()
	tr, tw := tar.NewReader(in), tar.NewWriter(out)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(tr)
		body = fn(h, body)
		h.Size = int64(len(body))
		tw.WriteHeader(h)
		tw.Write(body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return dst
}

func TestImportFromADockerArchiveCaps(t *testing.T) {
	tag, _ := name.NewTag("example.invalid/saved:v1")
	write := func(img v1.Image) string {
		p := filepath.Join(t.TempDir(), "saved.tar")
		if err := tarball.WriteToFile(p, tag, img); err != nil {
			t.Fatal(err)
		}
		return p
	}
	wantTooLarge(t, "a config over the cap", tryImport(t, "docker-archive:"+write(smallImage(t, oci.MaxManifestBytes)), oci.Stall{}))
	padded := rewriteArchive(t, write(smallImage(t, 0)), func(h *tar.Header, body []byte) []byte {
		if h.Name == "manifest.json" {
			return append(body, bytes.Repeat([]byte(" "), oci.MaxManifestBytes)...)
		}
		return body
	})
	wantTooLarge(t, "a manifest.json over the cap", tryImport(t, "docker-archive:"+padded, oci.Stall{}))
	looped := rewriteArchive(t, write(smallImage(t, 0)), func(h *tar.Header, body []byte) []byte {
		if h.Name == "manifest.json" {
			h.Typeflag, h.Linkname = tar.TypeSymlink, "manifest.json"
			return nil
		}
		return body
	})
	if err := tryImport(t, "docker-archive:"+looped, oci.Stall{}); errdefs.Class(err) != "invalid_argument" {
		t.Errorf("a manifest.json that links to itself: %v; want invalid argument", err)
	}
}

func TestDigestErrorSaysWhatToDo(t *testing.T) {
	err := oci.CheckBytes([]byte("x"), v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}, "config")
	if msg := fmt.Sprint(err); !strings.Contains(msg, "want sha256:000") || !strings.Contains(msg, "got sha256:") || !strings.Contains(msg, "intact copy") {
		t.Errorf("%s", msg)
	}
}
