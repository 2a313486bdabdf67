package sandbox

import (
	"context"
	"fmt"
	"os"
	"strings"

	"isopod/internal/agentproto"
	"isopod/internal/warmpool"
)

// The warm pool's housekeeping in the core: what makes a snapshot stale
// (for the listing, warmpool.Catalog.List) or dead (for `isopod vm gc`).
// The catalog itself is internal/warmpool.

// WarmStale is the judge a warm-pool listing takes (warmpool.Catalog.List):
// why m would not be used by an eligible run of its sizes now ("" when it
// would).
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
		if m.Parts.Assembled {
			if why := m.LayerGone(); why != "" {
				return why
			}
			in.key = in.key.WithRoot(m.Parts.Layers, m.Parts.ScratchMiB)
		}
		if d := in.key.Diff(m.Parts); len(d) > 0 {
			return "changed since the build: " + strings.Join(d, ", ")
		}
		return ""
	}
}

// gcWarm removes what no run can use again and returns the names removed.
func (s *Service) gcWarm() []string {
	return s.warm.GC(s.warmDead)
}

// warmDead says why m can never be used again ("" when it may be): its base
// build is gone or was rebuilt, its format or protocol is old, the host
// kernel or CPU changed, or the fetched guest kernel's initramfs was
// rebuilt. Parts that follow one call's settings (ISOPOD_ACCEL,
// ISOPOD_KERNEL, ISOPOD_QEMU) never make a snapshot dead.
func (s *Service) warmDead(m *warmpool.Meta) string {
	base, err := s.lookupBase(m.Parts.Base)
	switch {
	case err != nil || base.SHA256 != m.Parts.BaseSHA256:
		return "base build gone"
	case m.Parts.Protocol != agentproto.Version || m.Parts.Format != warmFormat:
		return "format or protocol changed"
	case m.Parts.Assembled && m.LayerGone() != "":
		return m.LayerGone()
	}
	in, err := s.warmKeyFor(context.Background(), base, m.Parts.VCPUs, m.Parts.MemMiB, m.Parts.NIC)
	if err != nil {
		return ""
	}
	fetched := strings.HasPrefix(m.Parts.GuestKernel, "sha256:") && strings.HasPrefix(in.key.GuestKernel, "sha256:")
	for _, d := range in.key.Diff(m.Parts) {
		if d == "host kernel" || d == "cpu model" || (fetched && (d == "initramfs" || d == "guest kernel")) {
			return d + " changed"
		}
	}
	return ""
}

// fileIdentity names a file by path, size and modification time.
func fileIdentity(path string) string {
	st, err := os.Stat(path)
	if err != nil {
		return path + ":missing"
	}
	return fmt.Sprintf("%s:%d:%d", path, st.Size(), st.ModTime().UnixNano())
}
