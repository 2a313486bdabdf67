package warmpool

import (
	"context"
	"errors"
	"testing"

	"isopod/internal/errdefs"
)

func TestRemoveArguments(t *testing.T) {
	c := newTestCatalog(t)
	for _, tt := range []struct {
		key  string
		all  bool
		want error
	}{
		{"", false, errdefs.ErrInvalidArgument},
		{"wk-1", true, errdefs.ErrInvalidArgument},
		{"../etc", false, errdefs.ErrInvalidArgument},
		{"wk-0123456789abcdef", false, errdefs.ErrNotFound},
	} {
		if _, err := c.Remove(tt.key, tt.all); !errors.Is(err, tt.want) {
			t.Errorf("Remove(%q, %v): %v; want %v", tt.key, tt.all, err, tt.want)
		}
	}
	k := Key{Base: "base-min", VCPUs: 1, MemMiB: 512}
	tmp, err := c.Stage(k.ID())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Publish(context.Background(), tmp, &Meta{Key: k.ID(), Parts: k}); err != nil {
		t.Fatal(err)
	}
	res, err := c.Remove(k.ID()[:8], false)
	if err != nil || len(res.Removed) != 1 || res.Removed[0] != k.ID() {
		t.Errorf("rm by prefix: %+v, %v", res, err)
	}
	if res, err := c.Remove("", true); err != nil || len(res.Removed) != 0 {
		t.Errorf("rm --all of nothing: %+v, %v", res, err)
	}
}
