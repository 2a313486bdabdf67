package oci

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/integration/e2e"
	"isopod/internal/knobs"
)

// hangOn serves the requests for paths containing part by never
// answering them.
func hangOn(part string) func(http.ResponseWriter, *http.Request, http.Handler) bool {
	return func(w http.ResponseWriter, req *http.Request, _ http.Handler) bool {
		if !strings.Contains(req.URL.Path, part) {
			return false
		}
		<-req.Context().Done()
		return true
	}
}

// dribbleOn answers GETs of paths containing part with what the
// registry would send, a byte every 100 ms.
func dribbleOn(part string) func(http.ResponseWriter, *http.Request, http.Handler) bool {
	return func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if req.Method != http.MethodGet || !strings.Contains(req.URL.Path, part) {
			return false
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		w.WriteHeader(rec.Code)
		for _, b := range rec.Body.Bytes() {
			w.Write([]byte{b})
			w.(http.Flusher).Flush()
			select {
			case <-req.Context().Done():
				return true
			case <-time.After(100 * time.Millisecond):
			}
		}
		return true
	}
}

// failsWith runs isopod with env, which must fail with class and a
// message holding want, in at most within.
func failsWith(t *testing.T, env []string, within time.Duration, class, want string, args ...string) {
	t.Helper()
	start := time.Now()
	r := e2e.RunFail(t, env, want, args...)
	if r.JSON["class"] != class {
		t.Errorf("isopod %v: class %v; want %s (%s)", args, r.JSON["class"], class, e2e.Str(r.JSON, "error"))
	}
	if took := time.Since(start); took > within {
		t.Errorf("isopod %v: answered after %s; want at most %s", args, took, within)
	}
}

// TestStalledAndBrokenRegistries: with ISOPOD_REGISTRY_STALL_S=1, a
// registry that never answers, or sends under the floor, fails an import
// and a pull as unavailable in seconds; a manifest over the cap is
// refused as invalid, a damaged config as a digest mismatch.
func TestStalledAndBrokenRegistries(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	img := image(t, "amd64", nil, "", layer(t, fileEntry("etc/id", "stall\n", 0o644)))
	reg.push(t, "test/stall:v1", img)
	env := []string{knobs.RegistryStallS + "=1"}
	src := reg.ref("test/stall:v1")

	reg.setHook(hangOn("/manifests/"))
	failsWith(t, env, 20*time.Second, "unavailable", knobs.RegistryStallS, "stage", "pull", reg.ref("stages/x:st-0011223344556677"))
	failsWith(t, env, 20*time.Second, "unavailable", "no answer from the registry in 1s", "image", "import", src, "--name", "stall")
	reg.setHook(hangOn("/v2/"))
	failsWith(t, env, 20*time.Second, "unavailable", "no answer from the registry in 1s", "image", "import", src, "--name", "stall")
	reg.setHook(dribbleOn("/blobs/" + onlyLayerBlob(t, img)))
	failsWith(t, env, 20*time.Second, "unavailable", "under the floor of 10 KiB/s", "image", "import", src, "--name", "stall")

	reg.setHook(func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if req.Method != http.MethodGet || !strings.HasSuffix(req.URL.Path, "/manifests/v1") {
			return false
		}
		rec := httptest.NewRecorder()
		inner.ServeHTTP(rec, req)
		w.Header().Set("Content-Type", rec.Header().Get("Content-Type"))
		w.Write(append(rec.Body.Bytes(), bytes.Repeat([]byte(" "), 4<<20)...))
		return true
	})
	failsWith(t, nil, time.Minute, "invalid_argument", "cap of 4 MiB", "image", "import", src, "--name", "stall")
	failsWith(t, nil, time.Minute, "invalid_argument", "cap of 4 MiB", "stage", "pull", src)
	reg.setHook(nil)

	cd, err := img.ConfigName()
	if err != nil {
		t.Fatal(err)
	}
	reg.tamperWith(cd.String())
	failsWith(t, nil, time.Minute, "failed_precondition", "config "+cd.String()+" does not match its digest: want "+cd.String()+", got sha256:",
		"image", "import", src, "--name", "stall")
	reg.tamperWith("")
}

// TestMCPStagePullWithinTimeout: sandbox_run calls naming a stage whose
// registry never answers answer at their own timeout_s, unavailable, and
// share one pull.
func TestMCPStagePullWithinTimeout(t *testing.T) {
	e2e.RequireVM(t)
	reg := startRegistry(t)
	var mu sync.Mutex
	manifestGets := 0
	reg.setHook(func(w http.ResponseWriter, req *http.Request, inner http.Handler) bool {
		if !strings.Contains(req.URL.Path, "/manifests/") {
			return false
		}
		mu.Lock()
		manifestGets++
		mu.Unlock()
		<-req.Context().Done()
		return true
	})
	cs := startMCPWith(t, "--stage-registry", reg.ref("stages/fleet"))
	var wg sync.WaitGroup
	for _, timeout := range []int{2, 4} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			call, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "sandbox_run",
				Arguments: map[string]any{"cmd": "true", "stage": "st-0011223344556677", "timeout_s": timeout}})
			if err != nil {
				t.Errorf("timeout_s %d: %v", timeout, err)
				return
			}
			took, text := time.Since(start), e2e.ToolText(call)
			if !call.IsError || !strings.Contains(text, "(unavailable)") || !strings.Contains(text, "did not finish within timeout_s") {
				t.Errorf("timeout_s %d: %s; want an unavailable error naming timeout_s", timeout, text)
			}
			if want := time.Duration(timeout) * time.Second; took < want || took > want+10*time.Second {
				t.Errorf("timeout_s %d: answered after %s", timeout, took)
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if manifestGets != 1 {
		t.Errorf("%d manifest requests for two calls; want the one pull they share", manifestGets)
	}
}
