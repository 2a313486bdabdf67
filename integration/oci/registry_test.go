package oci

import (
	"archive/tar"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"isopod/integration/e2e"
)

// testRegistry is go-containerregistry's registry, in this process, on
// loopback, with what the tests need around it.
type testRegistry struct {
	srv  *httptest.Server
	Host string // 127.0.0.1:port

	mu sync.Mutex // guards following
	// user and pass, when set, are required (HTTP basic auth).
	user, pass string
	// tamper names a blob digest whose bytes are served damaged.
	tamper string
	// uploads counts the blob uploads finished, by digest.
	uploads map[string]int
	// hook, when set, serves the requests it returns true for.
	hook func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool
}

func startRegistry(t testing.TB) *testRegistry {
	t.Helper()
	r := &testRegistry{uploads: map[string]int{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		user, pass, tamper, hook := r.user, r.pass, r.tamper, r.hook
		r.mu.Unlock()
		if hook != nil && hook(w, req, inner) {
			return
		}
		if user != "" {
			if u, p, ok := req.BasicAuth(); !ok || u != user || p != pass {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"who are you"}]}`, http.StatusUnauthorized)
				return
			}
		}
		if req.Method == http.MethodPut && strings.Contains(req.URL.Path, "/blobs/uploads/") {
			if d := req.URL.Query().Get("digest"); d != "" {
				defer func() { r.mu.Lock(); r.uploads[d]++; r.mu.Unlock() }()
			}
		}
		if tamper != "" && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+tamper) {
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, req)
			b := rec.Body.Bytes()
			if len(b) > 0 {
				b[len(b)/2] ^= 0xff
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			w.Write(b)
			return
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(r.srv.Close)
	r.Host = strings.TrimPrefix(r.srv.URL, "http://")
	return r
}

func (r *testRegistry) requireAuth(user, pass string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.user, r.pass = user, pass
}

func (r *testRegistry) setHook(h func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hook = h
}

func (r *testRegistry) tamperWith(digest string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tamper = digest
}

// uploadsOf returns how many times each blob was uploaded.
func (r *testRegistry) uploadCounts() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.uploads {
		out[k] = v
	}
	return out
}

// ref names repo:tag in the registry.
func (r *testRegistry) ref(repoTag string) string { return r.Host + "/" + repoTag }

// push writes img (a v1.Image or v1.ImageIndex) as ref.
func (r *testRegistry) push(t testing.TB, ref string, img any) {
	t.Helper()
	tag, err := name.NewTag(r.ref(ref))
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	user, pass := r.user, r.pass
	r.mu.Unlock()
	opts := []remote.Option{}
	if user != "" {
		opts = append(opts, remote.WithAuth(&authn.Basic{Username: user, Password: pass}))
	}
	switch x := img.(type) {
	case v1.Image:
		err = remote.Write(tag, x, opts...)
	case v1.ImageIndex:
		err = remote.WriteIndex(tag, x, opts...)
	}
	if err != nil {
		t.Fatal(err)
	}
}

// dockerConfig writes a Docker config.json holding credentials for host
// and returns its directory.
func dockerConfig(t testing.TB, host, user, pass string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := map[string]any{"auths": map[string]any{host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))}}}
	b, _ := json.Marshal(cfg)
	if err := os.WriteFile(filepath.Join(dir, "config.json"), b, 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// entry is one file of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	major, minor     int64
}

func fileEntry(name, body string, mode int64) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: mode}
}
func dirEntry(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symEntry(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}

// layer makes a gzip layer of entries.
func layer(t testing.TB, ents ...entry) v1.Layer {
	t.Helper()
	return layerWith(t, ents)
}

// zstdLayer makes a zstd layer of entries.
func zstdLayer(t testing.TB, ents ...entry) v1.Layer {
	t.Helper()
	return layerWith(t, ents, tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
}

func layerWith(t testing.TB, ents []entry, opts ...tarball.LayerOption) v1.Layer {
	t.Helper()
	var b bytes.Buffer
	w := tar.NewWriter(&b)
	for _, e := range ents {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Uid: e.uid, Gid: e.gid, Linkname: e.link,
			Devmajor: e.major, Devminor: e.minor, ModTime: time.Unix(1700000000, 0)}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if err := w.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(e.body))
	}
	w.Close()
	raw := b.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(raw)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// image makes a linux/arch image of layers with env and workdir.
func image(t testing.TB, arch string, env []string, workdir string, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", arch
	cf.Config.Env, cf.Config.WorkingDir = env, workdir
	cf.Config.Entrypoint = []string{"/never/run"}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// index holds imgs, each described with its platform.
func index(imgs map[string]v1.Image) v1.ImageIndex {
	var adds []mutate.IndexAddendum
	for arch, img := range imgs {
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: arch}}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}

var (
	busyboxOnce sync.Once
	busybox     []byte
	busyboxErr  error
)

// staticBusybox is base-min's busybox, which the test images carry so
// that the guest can look at itself.
func staticBusybox(t testing.TB) []byte {
	t.Helper()
	busyboxOnce.Do(func() {
		busybox, busyboxErr = exec.Command("unsquashfs", "-cat", filepath.Join(e2e.HomeDir, "images", "base-min.sqfs"), "bin/busybox").Output()
	})
	if busyboxErr != nil || len(busybox) < 100000 {
		t.Skipf("no busybox to put in test images (unsquashfs -cat base-min.sqfs bin/busybox: %v)", busyboxErr)
	}
	return busybox
}
