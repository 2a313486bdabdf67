package warmpool

import (
	"fmt"
	"os"
	"sort"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// The catalog's housekeeping: the listing `isopod warmpool list` prints,
// which says which snapshots are stale, and `isopod warmpool rm`. Whether
// a snapshot is stale is the core's judgement: it computes a shape's key
// as a run would now (sandbox.Service.WarmStale).

// Entry describes one warm-pool snapshot: the shape of the runs it
// serves, what it costs and how much it is used.
type Entry struct {
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
	// RootAssembled: the snapshot's root is assembled from the stage
	// layers Stages (ids, root first) and a scratch disk of ScratchMiB.
	RootAssembled bool     `json:"root_assembled,omitempty"`
	Stages        []string `json:"stages,omitempty"`
	ScratchMiB    int      `json:"scratch_mib,omitempty"`
	// Stale: an eligible run with these sizes would use another key now.
	Stale       bool   `json:"stale"`
	StaleReason string `json:"stale_reason,omitempty"`
}

// ListResult is the listing of the snapshots.
type ListResult struct {
	OK        bool    `json:"ok"`
	Snapshots []Entry `json:"snapshots"`
}

// RemoveResult is what a removal removed.
type RemoveResult struct {
	OK         bool     `json:"ok"`
	Removed    []string `json:"removed"`
	FreedBytes int64    `json:"freed_bytes"`
}

// List lists the snapshots, newest first; stale says why one would not be
// used by an eligible run of its sizes now ("" when it would).
func (c *Catalog) List(stale func(*Meta) string) *ListResult {
	res := &ListResult{OK: true, Snapshots: []Entry{}}
	for _, id := range c.IDs() {
		m, err := c.Read(id)
		if err != nil {
			continue
		}
		u := c.Usage(id, m)
		ent := Entry{
			Key: m.Key, Base: m.Parts.Base, BaseSHA256: m.Parts.BaseSHA256, VCPUs: m.Parts.VCPUs, MemMiB: m.Parts.MemMiB,
			Network: m.Parts.NIC, Accel: m.Accel, Built: m.Built.Format(time.RFC3339), BuildMS: m.BuildMS,
			Allocated: u.Bytes, Uses: u.Uses, LastUsed: u.LastUsed.Format(time.RFC3339), Path: c.Dir(id),
			RootAssembled: m.Parts.Assembled, Stages: m.Parts.Layers, ScratchMiB: m.Parts.ScratchMiB,
		}
		if why := stale(m); why != "" {
			ent.Stale, ent.StaleReason = true, why
		}
		res.Snapshots = append(res.Snapshots, ent)
	}
	sort.Slice(res.Snapshots, func(i, j int) bool { return res.Snapshots[i].Built > res.Snapshots[j].Built })
	return res
}

// Remove removes one snapshot by key (or a unique prefix of one), or all
// of them.
func (c *Catalog) Remove(key string, all bool) (*RemoveResult, error) {
	switch {
	case all && key != "":
		return nil, fmt.Errorf("warmpool rm: give a KEY or --all, not both: %w", errdefs.ErrInvalidArgument)
	case !all && key == "":
		return nil, fmt.Errorf("warmpool rm: give a KEY (see `isopod warmpool list`) or --all: %w", errdefs.ErrInvalidArgument)
	}
	res := &RemoveResult{OK: true, Removed: []string{}}
	keys := c.IDs()
	if !all {
		id, err := c.Resolve(key)
		if err != nil {
			return nil, fmt.Errorf("warmpool rm %w", err)
		}
		keys = []string{id}
	}
	for _, k := range keys {
		if ok, freed := c.Retire(k, ""); ok {
			res.Removed = append(res.Removed, k)
			res.FreedBytes += freed
		}
	}
	if all {
		// Forgotten with the snapshots: shapes recur anew.
		os.RemoveAll(c.shapeUses())
	}
	if !all && len(res.Removed) == 0 {
		return nil, fmt.Errorf("warmpool rm %s: no such snapshot (see `isopod warmpool list`): %w", key, errdefs.ErrNotFound)
	}
	return res, nil
}
