package oci

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
)

// fastStall is a small window for tests: 300 ms, 64 KiB/s.
var fastStall = Stall{Window: 300 * time.Millisecond, MinRate: 64 << 10}

// serve runs h on loopback and returns a client through isopod's
// transport with stall s.
func serve(t *testing.T, s Stall, h http.HandlerFunc) (*httptest.Server, *http.Client) {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, &http.Client{Transport: &watchTransport{next: http.DefaultTransport, stall: s}}
}

// trickle writes n bytes of b, one every gap, flushing each, until the
// client goes away.
func trickle(w http.ResponseWriter, r *http.Request, n int, gap time.Duration) {
	w.WriteHeader(http.StatusOK)
	w.(http.Flusher).Flush()
	for range n {
		select {
		case <-r.Context().Done():
			return
		case <-time.After(gap):
		}
		w.Write([]byte("x"))
		w.(http.Flusher).Flush()
	}
}

// get reads url's body through c and says how long it took.
func get(c *http.Client, ctx context.Context, url string) ([]byte, time.Duration, error) {
	start := time.Now()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := c.Do(req)
	if err != nil {
		return nil, time.Since(start), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return b, time.Since(start), err
}

func TestStalledRequestsFail(t *testing.T) {
	for _, c := range []struct {
		name  string
		h     http.HandlerFunc
		moved bool
	}{
		{"no headers ever", func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }, false},
		{"headers, then silence", func(w http.ResponseWriter, r *http.Request) { trickle(w, r, 0, 0); <-r.Context().Done() }, true},
		{"a byte every 20 ms", func(w http.ResponseWriter, r *http.Request) { trickle(w, r, 1000, 20*time.Millisecond) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv, client := serve(t, fastStall, c.h)
			_, took, err := get(client, context.Background(), srv.URL+"/v2/x/blobs/sha256:00")
			var se *StallError
			if !errors.As(err, &se) || errdefs.Class(err) != "unavailable" {
				t.Fatalf("%v after %s; want a stall, class unavailable", err, took)
			}
			if took > 3*fastStall.Window {
				t.Errorf("the stall was noticed after %s; want about %s", took, fastStall.Window)
			}
			if (se.Moved > 0) != c.moved || !strings.Contains(err.Error(), "/v2/x/blobs/sha256:00") || strings.Count(err.Error(), "/v2/x/blobs") != 1 {
				t.Errorf("stall %q (moved %d); want the request named once", err, se.Moved)
			}
		})
	}
}

func TestSteadyTransfersPass(t *testing.T) {
	// Three windows of a body at up to 400 KiB/s, over the 64 KiB/s floor.
	chunk := bytes.Repeat([]byte("y"), 4<<10)
	srv, client := serve(t, fastStall, func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut {
			n, _ := io.Copy(io.Discard, r.Body)
			time.Sleep(fastStall.Window / 2) // an answer after a pause shorter than the window
			fmt.Fprint(w, n)
			return
		}
		deadline := time.Now().Add(3 * fastStall.Window)
		for time.Now().Before(deadline) {
			w.Write(chunk)
			w.(http.Flusher).Flush()
			time.Sleep(10 * time.Millisecond)
		}
	})
	b, took, err := get(client, context.Background(), srv.URL+"/v2/x/blobs/sha256:00")
	if err != nil || len(b) == 0 {
		t.Fatalf("a steady download: %v after %s", err, took)
	}
	// An upload at the same pace: what is sent counts.
	pr, pw := io.Pipe()
	go func() {
		deadline := time.Now().Add(3 * fastStall.Window)
		for time.Now().Before(deadline) {
			if _, err := pw.Write(chunk); err != nil {
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
		pw.Close()
	}()
	req, _ := http.NewRequest(http.MethodPut, srv.URL+"/v2/x/blobs/uploads/1", pr)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("a steady upload: %v", err)
	}
	resp.Body.Close()
}

func TestCancelledRequestIsNotAStall(t *testing.T) {
	srv, client := serve(t, fastStall, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	ctx, cancel := context.WithTimeout(context.Background(), fastStall.Window/3)
	defer cancel()
	_, _, err := get(client, ctx, srv.URL+"/v2/")
	var se *StallError
	if errors.As(err, &se) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a request its caller gave up on: %v; want the caller's deadline", err)
	}
}

func TestManifestsAreCappedAndChecked(t *testing.T) {
	good := []byte(`{"schemaVersion":2}`)
	sum := sha256.Sum256(good)
	digest := fmt.Sprintf("sha256:%x", sum)
	big := bytes.Repeat([]byte(" "), MaxManifestBytes+1)
	srv, client := serve(t, DefaultStall, func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasSuffix(r.URL.Path, "/manifests/sized"):
			w.Write(big) // one write: a Content-Length
		case strings.HasSuffix(r.URL.Path, "/manifests/chunked"):
			for i := 0; i < len(big); i += 1 << 20 {
				w.Write(big[i:min(i+1<<20, len(big))])
				w.(http.Flusher).Flush()
			}
		case strings.HasSuffix(r.URL.Path, "/manifests/"+digest), strings.HasSuffix(r.URL.Path, "/manifests/v1"):
			w.Write(good)
		case strings.HasSuffix(r.URL.Path, "/blobs/"+digest):
			w.Write(big)
		default:
			w.Write(append([]byte(nil), good[:len(good)-1]...))
		}
	})
	for _, ref := range []string{"sized", "chunked"} {
		_, _, err := get(client, context.Background(), srv.URL+"/v2/x/manifests/"+ref)
		var te *TooLargeError
		if !errors.As(err, &te) || errdefs.Class(err) != "invalid_argument" || !strings.Contains(err.Error(), "4 MiB") {
			t.Errorf("a manifest over the cap (%s): %v; want an invalid-argument refusal naming the cap", ref, err)
		}
	}
	for _, ref := range []string{"v1", digest} {
		if b, _, err := get(client, context.Background(), srv.URL+"/v2/x/manifests/"+ref); err != nil || !bytes.Equal(b, good) {
			t.Errorf("manifest %s: %q, %v", ref, b, err)
		}
	}
	other := "sha256:" + strings.Repeat("ab", 32)
	_, _, err := get(client, context.Background(), srv.URL+"/v2/x/manifests/"+other)
	var de *DigestError
	if !errors.As(err, &de) || de.Want != other || !strings.HasPrefix(de.Got, "sha256:") {
		t.Errorf("a manifest asked for by digest that has another: %v; want a digest refusal naming both", err)
	}
	if b, _, err := get(client, context.Background(), srv.URL+"/v2/x/blobs/"+digest); err != nil || len(b) != len(big) {
		t.Errorf("a blob is not a manifest: %d bytes, %v", len(b), err)
	}
}
