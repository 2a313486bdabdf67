package transfer

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
	"isopod/internal/store"
)

// testStall is a small stall window for tests: 300 ms, 1 KiB/s.
var testStall = oci.Stall{Window: 300 * time.Millisecond, MinRate: 1 << 10}

// hang serves a request by never answering it.
func hang(w http.ResponseWriter, req *http.Request) { <-req.Context().Done() }

// dribble answers with headers, then a byte every 50 ms.
func dribble(w http.ResponseWriter, req *http.Request) {
	w.WriteHeader(http.StatusOK)
	for {
		w.Write([]byte(" "))
		w.(http.Flusher).Flush()
		select {
		case <-req.Context().Done():
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// when serves the requests match selects with h.
func when(match func(*http.Request) bool, h http.HandlerFunc) func(http.ResponseWriter, *http.Request, http.Handler) bool {
	return func(w http.ResponseWriter, req *http.Request, _ http.Handler) bool {
		if !match(req) {
			return false
		}
		h(w, req)
		return true
	}
}

func isGet(part string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.Method == http.MethodGet && strings.Contains(r.URL.Path, part) }
}

// TestStalledRegistryFailsUnavailable: a registry that stops answering
// or dribbles fails a pull or a push within about the stall window, as
// unavailable, wherever it stalls: the first request, a manifest's
// headers or body, a blob, an upload.
func TestStalledRegistryFailsUnavailable(t *testing.T) {
	reg := startRegistry(t)
	a := newHost(t)
	base := fakeBase(t, 5)
	m := a.commit(t, 5, "s/x", "", base)
	push(t, a, []store.Meta{m}, base, reg.host+"/stages/s:x", false)
	layer := reg.lastLayer(t, m.ID, a)
	isPut := func(r *http.Request) bool { return r.Method != http.MethodGet && r.Method != http.MethodHead }
	for _, c := range []struct {
		name  string
		match func(*http.Request) bool
		h     http.HandlerFunc
		push  bool
	}{
		{"the first request", func(r *http.Request) bool { return r.URL.Path == "/v2/" }, hang, false},
		{"the credential exchange", func(r *http.Request) bool { return true }, func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/token" {
				hang(w, r)
				return
			}
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+`/token",service="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED"}]}`, http.StatusUnauthorized)
		}, false},
		{"a manifest's headers", isGet("/manifests/"), hang, false},
		{"a manifest's body", isGet("/manifests/"), dribble, false},
		{"a layer blob", isGet("/blobs/" + layer), dribble, false},
		{"a HEAD", func(r *http.Request) bool { return r.Method == http.MethodHead }, hang, true},
		{"an upload", isPut, hang, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg.setHook(when(c.match, c.h))
			t.Cleanup(func() { reg.setHook(nil) })
			b := newHost(t)
			cl := Client{Registry: oci.Client{Stall: testStall}}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			var err error
			if c.push {
				m2 := a.commit(t, 6, "s/y", "", base)
				_, err = cl.PushStage(ctx, PushRequest{Store: a.st, Chain: []store.Meta{m2}, Base: base, WithoutBase: true, Dest: reg.host + "/stages/other:y"})
			} else {
				_, err = cl.PullStage(ctx, PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, reg.host+"/stages/s:x")})
			}
			took := time.Since(start)
			var se *oci.StallError
			if !errors.As(err, &se) || errdefs.Class(err) != "unavailable" {
				t.Fatalf("after %s: %v; want a stall, class unavailable", took, err)
			}
			if took > 10*testStall.Window {
				t.Errorf("the stall was given up on after %s; want about %s", took, testStall.Window)
			}
			if _, err := b.st.Get(m.ID); err == nil {
				t.Error("a stalled pull left the stage")
			}
		})
	}
}

// TestPullRefusesWhatTheSourceBroke: a manifest over the cap is refused
// as invalid, naming the cap; a config whose bytes are not its digest is
// a digest refusal naming both digests.
func TestPullRefusesWhatTheSourceBroke(t *testing.T) {
	reg := startRegistry(t)
	a, b := newHost(t), newHost(t)
	base := fakeBase(t, 7)
	m := a.commit(t, 7, "r/x", "", base)
	push(t, a, []store.Meta{m}, base, reg.host+"/stages/r:x", true)
	src := reg.host + "/stages/r:x"

	// The stage's own manifest, padded with white space past the cap:
	// still the same JSON.
	reg.setHook(func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/manifests/x") {
			return false
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		body := append(rec.Body.Bytes(), bytes.Repeat([]byte(" "), oci.MaxManifestBytes)...)
		w.Header().Set("Content-Type", rec.Header().Get("Content-Type"))
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.Write(body)
		return true
	})
	_, err := Client{}.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, src)})
	var te *oci.TooLargeError
	if !errors.As(err, &te) || errdefs.Class(err) != "invalid_argument" || !strings.Contains(err.Error(), "4 MiB") {
		t.Errorf("a manifest over the cap: %v; want an invalid-argument refusal naming the cap", err)
	}
	reg.setHook(nil)

	ref, _ := name.ParseReference(src)
	desc, err := remote.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	man, err := v1.ParseManifest(bytes.NewReader(desc.Manifest))
	if err != nil {
		t.Fatal(err)
	}
	reg.mu.Lock()
	reg.bad = man.Config.Digest.String()
	reg.mu.Unlock()
	_, err = Client{}.PullStage(context.Background(), PullRequest{Store: b.st, Paths: b.p, Ref: pullRef(t, src)})
	var de *oci.DigestError
	if !errors.As(err, &de) || de.Want != man.Config.Digest.String() || !strings.HasPrefix(de.Got, "sha256:") || de.Got == de.Want ||
		errdefs.Class(err) != "failed_precondition" {
		t.Errorf("a damaged config: %v; want a digest refusal naming the digest wanted and the one got", err)
	}
}
