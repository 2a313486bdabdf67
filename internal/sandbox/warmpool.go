package sandbox

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
	"isopod/internal/warmpool"
)

// The warm pool's housekeeping API: list, remove, and the dead-snapshot
// test `isopod vm gc` uses. The catalog itself is internal/warmpool.

// WarmEntry describes one warm-pool snapshot: the shape of the runs it
// serves, what it costs and how much it is used.
type WarmEntry struct {
	Key        string    `json:"key"`
	Base       string    `json:"base"`
	BaseSHA256 string    `json:"base_sha256"`
	VCPUs      int       `json:"vcpus"`
	MemMiB     int       `json:"mem_mib"`
	Network    bool      `json:"network"`
	Accel      vmm.Accel `json:"accel"`
	Built      string    `json:"built"`
	BuildMS    int64     `json:"build_ms"`
	Allocated  int64     `json:"allocated_bytes"`
	Uses       int64     `json:"uses"`
	LastUsed   string    `json:"last_used"`
	Path       string    `json:"path"`
	// Stale: an eligible run with these sizes would use another key now.
	Stale       bool   `json:"stale"`
	StaleReason string `json:"stale_reason,omitempty"`
}

type WarmListResult struct {
	OK        bool        `json:"ok"`
	Snapshots []WarmEntry `json:"snapshots"`
}

type WarmRemoveResult struct {
	OK         bool     `json:"ok"`
	Removed    []string `json:"removed"`
	FreedBytes int64    `json:"freed_bytes"`
}

// WarmList lists the snapshots, newest first, and says which are stale.
func (s *Service) WarmList(ctx context.Context) (*WarmListResult, error) {
	res := &WarmListResult{OK: true, Snapshots: []WarmEntry{}}
	for _, id := range s.warm.IDs() {
		m, err := s.warm.Read(id)
		if err != nil {
			continue
		}
		dir := s.warm.Dir(id)
		u := s.warm.Usage(id, m)
		ent := WarmEntry{
			Key: m.Key, Base: m.Parts.Base, BaseSHA256: m.Parts.BaseSHA256, VCPUs: m.Parts.VCPUs, MemMiB: m.Parts.MemMiB,
			Network: m.Parts.NIC, Accel: m.Accel, Built: m.Built.Format(time.RFC3339), BuildMS: m.BuildMS,
			Allocated: u.Bytes, Uses: u.Uses, LastUsed: u.LastUsed.Format(time.RFC3339), Path: dir,
		}
		if why := s.warmStale(ctx, m); why != "" {
			ent.Stale, ent.StaleReason = true, why
		}
		res.Snapshots = append(res.Snapshots, ent)
	}
	sort.Slice(res.Snapshots, func(i, j int) bool { return res.Snapshots[i].Built > res.Snapshots[j].Built })
	return res, nil
}

// warmStale says why m would not be used by an eligible run of its sizes
// now ("" when it would).
func (s *Service) warmStale(ctx context.Context, m *warmpool.Meta) string {
	base, err := s.lookupBase(m.Parts.Base)
	if err != nil {
		return "base " + m.Parts.Base + " is not usable: " + err.Error()
	}
	in, err := s.warmKeyFor(ctx, base, m.Parts.VCPUs, m.Parts.MemMiB, m.Parts.NIC)
	if err != nil {
		return err.Error()
	}
	if d := in.key.Diff(m.Parts); len(d) > 0 {
		return "changed since the build: " + strings.Join(d, ", ")
	}
	return ""
}

// WarmRemove removes one snapshot by key (or a unique prefix of one), or
// all of them.
func (s *Service) WarmRemove(ctx context.Context, key string, all bool) (*WarmRemoveResult, error) {
	switch {
	case all && key != "":
		return nil, invalid("warmpool rm: give a KEY or --all, not both")
	case !all && key == "":
		return nil, invalid("warmpool rm: give a KEY (see `isopod warmpool list`) or --all")
	}
	res := &WarmRemoveResult{OK: true, Removed: []string{}}
	keys := s.warm.IDs()
	if !all {
		id, err := s.warm.Resolve(key)
		if err != nil {
			return nil, fmt.Errorf("warmpool rm %w", err)
		}
		keys = []string{id}
	}
	for _, k := range keys {
		if ok, freed := s.warm.Retire(k, ""); ok {
			res.Removed = append(res.Removed, k)
			res.FreedBytes += freed
		}
	}
	if !all && len(res.Removed) == 0 {
		return nil, fmt.Errorf("warmpool rm %s: no such snapshot (see `isopod warmpool list`): %w", key, errdefs.ErrNotFound)
	}
	return res, nil
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
