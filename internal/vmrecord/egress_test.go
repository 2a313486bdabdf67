package vmrecord

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"isopod/internal/errdefs"
	"isopod/internal/paths"
)

func TestEgressSuggestErrors(t *testing.T) {
	home := t.TempDir()
	s := Records{Paths: paths.Paths{Home: home}}
	ctx := context.Background()
	for _, tt := range []struct {
		id   string
		want error
	}{
		{"../etc", errdefs.ErrInvalidArgument},
		{"vm-XYZ", errdefs.ErrInvalidArgument},
		{"vm-0000000a", errdefs.ErrNotFound},
	} {
		if _, err := s.EgressSuggest(ctx, tt.id); !errors.Is(err, tt.want) {
			t.Errorf("EgressSuggest(%q) = %v; want %v", tt.id, err, tt.want)
		}
	}
	dir := filepath.Join(home, "vms", "vm-0000000b")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EgressSuggest(ctx, "vm-0000000b"); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("NAT run (no record): %v; want ErrFailedPrecondition", err)
	}
	line := `{"ts_ms":1,"proto":"dns","host":"pypi.org","port":0,"allowed":false,"reason":"not_allowed","bytes_up":0,"bytes_down":0,"qtype":"A"}` + "\n"
	if err := os.WriteFile(filepath.Join(dir, EgressLogName), []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	res, err := s.EgressSuggest(ctx, "vm-0000000b")
	if err != nil || !res.OK || !slices.Equal(res.Flags, []string{"--allow-host", "pypi.org"}) {
		t.Errorf("suggest: %+v, %v", res, err)
	}
}
