package stages_test

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
	"isopod/internal/sandbox/sandboxtest"
	"isopod/internal/settings"
	"isopod/internal/stages"
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
	p, _ := sandboxtest.Root(t)
	s := stages.New(stages.Options{Settings: settings.Settings{Paths: p, RegistryStall: oci.Stall{Window: window}}})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err := s.StagePull(ctx, host+"/stages/x:st-0011223344556677", stages.StagePullOptions{})
	var se *oci.StallError
	if !errors.As(err, &se) || errdefs.Class(err) != "unavailable" || time.Since(start) > 10*window {
		t.Errorf("pull from a stalled registry: %v after %s; want a stall, unavailable, after about %s", err, time.Since(start), window)
	}

	slow := stages.New(stages.Options{Settings: settings.Settings{Paths: p}})
	short, cancel2 := context.WithTimeout(context.Background(), window)
	defer cancel2()
	start = time.Now()
	_, err = slow.StagePull(short, host+"/stages/x:st-0011223344556688", stages.StagePullOptions{})
	if errdefs.Class(err) != "unavailable" || !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*window {
		t.Errorf("a caller's deadline before the stall window: %v after %s; want unavailable at the deadline", err, time.Since(start))
	}
}
