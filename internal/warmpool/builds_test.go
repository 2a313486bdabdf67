package warmpool

import (
	"context"
	"testing"
)

// TestBuildsOnePerKey: a key's second build does not start while its
// first runs; Close cancels the builds under way, waits for them, and
// starts no more.
func TestBuildsOnePerKey(t *testing.T) {
	b := NewBuilds()
	started := make(chan struct{})
	ended := false
	if !b.Start("k", func(ctx context.Context) {
		close(started)
		<-ctx.Done()
		ended = true
	}) {
		t.Fatal("the first build did not start")
	}
	<-started
	if b.Start("k", func(context.Context) {}) {
		t.Error("a second build of the same key started")
	}
	b.Close()
	if !ended {
		t.Error("Close returned before the build ended")
	}
	if b.Start("other", func(context.Context) {}) {
		t.Error("a build started after Close")
	}
	b.Close()
}
