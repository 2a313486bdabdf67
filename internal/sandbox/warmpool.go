package sandbox

import (
	"context"
	"fmt"
	"os"

	"isopod/internal/agentproto"
	"isopod/internal/warmpool"
)

// The warm pool's housekeeping in the core: what makes a snapshot stale
// (for the listing, warmpool.Catalog.List) or dead (for `isopod vm gc`).
// The catalog itself is internal/warmpool.

// WarmStale is the judge a warm-pool listing takes (warmpool.Catalog.List):
// why m would not be used by an eligible run of its sizes now ("" when it
// would; warmpool.Meta.Stale).
func (s *Service) WarmStale(ctx context.Context) func(*warmpool.Meta) string {
	return func(m *warmpool.Meta) string {
		base, err := s.lookupBase(m.Parts.Base)
		if err != nil {
			return "base " + m.Parts.Base + " is not usable: " + err.Error()
		}
		in, err := s.warmKeyFor(ctx, base, m.Parts.VCPUs, m.Parts.MemMiB, m.Parts.NIC)
		if err != nil {
			return err.Error()
		}
		return m.Stale(in.key)
	}
}

// gcWarm removes what no run can use again and returns the names removed.
func (s *Service) gcWarm() []string {
	return s.warm.GC(s.warmDead)
}

// warmDead says why m can never be used again ("" when it may be;
// warmpool.Meta.Dead): its base build is gone or was rebuilt, or the
// current key says so.
func (s *Service) warmDead(m *warmpool.Meta) string {
	base, err := s.lookupBase(m.Parts.Base)
	if err != nil || base.SHA256 != m.Parts.BaseSHA256 {
		return "base build gone"
	}
	return m.Dead(warmFormat, agentproto.Version, func() (warmpool.Key, error) {
		in, err := s.warmKeyFor(context.Background(), base, m.Parts.VCPUs, m.Parts.MemMiB, m.Parts.NIC)
		return in.key, err
	})
}

// fileIdentity names a file by path, size and modification time.
func fileIdentity(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return path + ":missing"
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
