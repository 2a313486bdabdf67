package sandbox_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/oci"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// hangingRegistry accepts connections and never answers.
func hangingRegistry(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() }))
	t.Cleanup(func() {
		srv.CloseClientConnections() // a pull nobody waits for any more goes on
		srv.Close()
	})
	return strings.TrimPrefix(srv.URL, "http://")
}

// TestStagePullFromAStalledRegistry: a pull from a registry that never
// answers ends as unavailable: at the configured stall window, or at the
// caller's deadline when that comes first.
func TestStagePullFromAStalledRegistry(t *testing.T) {
	t.Parallel()
	host := hangingRegistry(t)
	window := 300 * time.Millisecond
	s, _ := newFakeWith(t, vmmfake.Config{}, func(o *sandbox.Options) { o.RegistryStall = oci.Stall{Window: window} })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.StagePull(ctx, host+"/stages/x:st-0011223344556677", sandbox.StagePullOptions{})
	var se *oci.StallError
	if !errors.As(err, &se) || errdefs.Class(err) != "unavailable" || time.Since(start) > 10*window {
		t.Errorf("pull from a stalled registry: %v after %s; want a stall, unavailable, after about %s", err, time.Since(start), window)
	}

	slow, _ := newFakeWith(t, vmmfake.Config{}, func(*sandbox.Options) {})
	short, cancel2 := context.WithTimeout(context.Background(), window)
	defer cancel2()
	start = time.Now()
	_, err = slow.StagePull(short, host+"/stages/x:st-0011223344556688", sandbox.StagePullOptions{})
	if errdefs.Class(err) != "unavailable" || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*window {
		t.Errorf("a caller's deadline before the stall window: %v after %s; want unavailable at the deadline", err, time.Since(start))
	}
}
