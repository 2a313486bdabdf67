package transfer

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"github.com/google/go-containerregistry/pkg/name"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-containerregistry/pkg/registry"

	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/oci"
	"isopod/internal/paths"
	"isopod/internal/store"
)

// host is one state root: a store and a (fake) base build of base-min.
type host struct {
	p  paths.Paths
	st *store.Store
}

func newHost(t *testing.T) host {
	t.Helper()
	p, err := paths.New(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Ensure(); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(p.Stages(), store.Options{LocksDir: p.Locks(), Version: "test"})
	if err != nil {
		t.Fatal(err)
	}
	return host{p, st}
}

// fakeBase is a base-min build whose squashfs is seed's bytes.
func fakeBase(t *testing.T, seed uint64) image.BaseInfo {
	t.Helper()
	b := make([]byte, 64<<10)
	rand.NewChaCha8([32]byte{byte(seed)}).Read(b)
	path := filepath.Join(t.TempDir(), "base-min.sqfs")
	os.WriteFile(path, b, 0o644)
	sum := sha256.Sum256(b)
	return image.BaseInfo{Flavor: image.FlavorBaseMin, ContentSHA256: hex.EncodeToString(sum[:]), Size: int64(len(b)), Path: path, Recipe: 2}
}

// commit commits a sparse scratch file of seed's data over parent.
func (h host) commit(t *testing.T, seed uint64, label, parent string, base image.BaseInfo) store.Meta {
	t.Helper()
	p := filepath.Join(t.TempDir(), "scratch.ext4")
	f, _ := os.Create(p)
	data := make([]byte, 300<<10)
	rand.NewChaCha8([32]byte{byte(seed), 1}).Read(data)
	f.WriteAt(data, 1<<20)
	f.Truncate(64 << 20)
	f.Close()
	m, _, err := h.st.Commit(context.Background(), store.CommitRequest{
		Scratch: p, Label: label, Parent: parent, BaseFlavor: base.Flavor, BaseSHA256: base.ContentSHA256, Argv: []string{"true"},
	})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testRegistry serves go-containerregistry's registry on loopback and
// counts blob uploads by digest; tamper damages one blob's bytes.
type testRegistry struct {
	host string
	mu   sync.Mutex // guards following
	puts map[string]int
	bad  string
	// hook, when set, serves the requests it returns true for.
	hook func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool
}

func startRegistry(t *testing.T) *testRegistry {
	r := &testRegistry{puts: map[string]int{}}
	inner := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		if d := req.URL.Query().Get("digest"); req.Method == http.MethodPut && d != "" {
			r.puts[d]++
		}
		bad, hook := r.bad, r.hook
		r.mu.Unlock()
		if hook != nil && hook(w, req, inner) {
			return
		}
		if bad != "" && req.Method == http.MethodGet && strings.HasSuffix(req.URL.Path, "/blobs/"+bad) {
			rec := httptest.NewRecorder()
			inner.ServeHTTP(rec, req)
			b := rec.Body.Bytes()
			b[len(b)/2] ^= 1
			w.WriteHeader(rec.Code)
			w.Write(b)
			return
		}
		inner.ServeHTTP(w, req)
	}))
	t.Cleanup(srv.Close)
	r.host = strings.TrimPrefix(srv.URL, "http://")
	return r
}

func (r *testRegistry) setHook(h func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.hook = h
}

func (r *testRegistry) uploads() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.puts {
		out[k] = v
	}
	return out
}

func push(t *testing.T, h host, chain []store.Meta, base image.BaseInfo, dest string, without bool) *PushResult {
	t.Helper()
	res, err := Client{}.PushStage(context.Background(), PushRequest{Store: h.st, Chain: chain, Base: base, WithoutBase: without, Dest: dest})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func moved(ls []LayerResult) []bool {
	var out []bool
	for _, l := range ls {
		out = append(out, l.Moved)
	}
	return out
}

func TestPushAndPullAChainWithItsBase(t *testing.T) {
	reg := startRegistry(t)
	a, b := newHost(t), newHost(t)
	base := fakeBase(t, 1)
	root := a.commit(t, 1, "p/root", "", base)
	tip := a.commit(t, 2, "p/tip", root.ID, base)

	first := push(t, a, []store.Meta{root}, base, reg.host+"/stages/p", false)
	if first.Ref != reg.host+"/stages/p:"+root.ID || !first.Base.Moved || !first.Layers[0].Moved {
		t.Fatalf("first push: %+v", first)
	}
	second := push(t, a, []store.Meta{root, tip}, base, reg.host+"/stages/p:tip", false)
	if got := moved(second.Layers); got[0] || !got[1] || second.Base.Moved {
		t.Fatalf("second push moved layers %v and base %v; want only the new layer", got, second.Base.Moved)
	}
	for d, n := range reg.uploads() {
		if n != 1 {
			t.Errorf("blob %s uploaded %d times", d, n)
		}
	}

	var reports []oci.Progress
	c := Client{Progress: func(p oci.Progress) { reports = append(reports, p) }}
	res, err := c.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/p:tip")})
	if err != nil {
		t.Fatal(err)
	}
	if res.Stage.ID != tip.ID || res.Stage.Digest != tip.Digest || res.Stage.Label != "p/tip" || !res.Base.Moved {
		t.Fatalf("pulled %+v, base %+v; want %s with its base", res.Stage, res.Base, tip.ID)
	}
	if last := reports[len(reports)-1]; !last.Final || last.Bytes == 0 || last.ItemsDone != last.Items {
		t.Errorf("last progress report %+v; want a final one with bytes and every item done", last)
	}
	if got, ok := image.StoredByID(b.p, base.ContentSHA256); !ok || got.Name != "" || got.PulledFrom != reg.host+"/stages/p" {
		t.Errorf("the pulled base is stored as %+v, %v; want it kept by content id", got, ok)
	}
	for _, m := range []store.Meta{root, tip} {
		x, _ := os.ReadFile(a.st.LayerPath(m.ID))
		y, _ := os.ReadFile(b.st.LayerPath(m.ID))
		if string(x) != string(y) {
			t.Errorf("stage %s arrived with other bytes", m.ID)
		}
	}
	// A host with the chain and base moves nothing; a push from it does
	// not pack again (its layers carry their blob records).
	again, err := Client{}.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/p:tip")})
	if err != nil || moved(again.Layers)[0] || moved(again.Layers)[1] || !again.Base.Present {
		t.Fatalf("pulling again: %+v, %v", again, err)
	}
	if _, ok := b.st.BlobRecord(tip.ID); !ok {
		t.Error("a pulled stage has no blob record")
	}
}

func TestPullRefusals(t *testing.T) {
	reg := startRegistry(t)
	a := newHost(t)
	base := fakeBase(t, 3)
	m := a.commit(t, 3, "q/x", "", base)
	push(t, a, []store.Meta{m}, base, reg.host+"/stages/nobase:x", true)

	b := newHost(t)
	_, err := Client{}.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/nobase:x")})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), base.ContentSHA256) || !strings.Contains(err.Error(), "isopod image build base-min") {
		t.Fatalf("pull over a missing base: %v; want a refusal naming the base and how to get it", err)
	}
	if _, err := b.st.Get(m.ID); err == nil {
		t.Fatal("a refused pull left a stage")
	}

	push(t, a, []store.Meta{m}, base, reg.host+"/stages/bad:x", false)
	reg.mu.Lock()
	reg.bad = reg.lastLayer(t, m.ID, a)
	reg.mu.Unlock()
	_, err = Client{}.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/bad:x")})
	var de *oci.DigestError
	if !errors.As(err, &de) {
		t.Fatalf("pull of a damaged blob: %v; want a digest refusal", err)
	}
	if _, err := b.st.Get(m.ID); err == nil {
		t.Fatal("a damaged blob became a stage")
	}
	if _, err := PullRef(reg.host + "/stages/bad"); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("pull source naming no tag or digest: %v; want invalid_argument", err)
	}
	if _, err := (Client{}).PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/none:x")}); err == nil {
		t.Error("pull of a missing tag: accepted")
	}
	if _, err := (Client{}).PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("pull with no source: %v; want invalid_argument", err)
	}
}

// pullRef parses a pull source the way a caller does, once.
func pullRef(t *testing.T, src string) name.Reference {
	t.Helper()
	ref, err := PullRef(src)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// lastLayer is the blob digest host a recorded for stage id.
func (r *testRegistry) lastLayer(t *testing.T, id string, a host) string {
	rec, ok := a.st.BlobRecord(id)
	if !ok {
		t.Fatalf("no blob record for %s", id)
	}
	return rec.Digest
}
