package vmrecord

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"isopod/internal/paths"
)

// Records are the VM records under a state root: what `isopod vm ls`
// lists and `isopod vm gc` prunes.
type Records struct {
	Paths paths.Paths
}

// VMEntry describes one VM record.
type VMEntry struct {
	ID       string   `json:"vm_id"`
	Name     string   `json:"name"`
	Created  string   `json:"created"`
	Argv     []string `json:"argv,omitempty"`
	Live     bool     `json:"live"`
	DirBytes int64    `json:"dir_bytes"`
	ExitCode *int     `json:"exit_code,omitempty"`
}

// VMListResult is the listing of VM records, as the front ends print it.
type VMListResult struct {
	OK  bool      `json:"ok"`
	VMs []VMEntry `json:"vms"`
}

// VMList lists VM records newest first.
func (rs Records) VMList(ctx context.Context) (*VMListResult, error) {
	res := &VMListResult{OK: true, VMs: []VMEntry{}}
	for _, r := range rs.List() {
		res.VMs = append(res.VMs, VMEntry{
			ID: r.ID, Name: r.Name, Created: r.Created.Format(time.RFC3339), Argv: r.Argv,
			Live: r.VMMRunning(), DirBytes: paths.DirBytes(rs.Paths.VM(r.ID)), ExitCode: r.ExitCode,
		})
	}
	return res, nil
}

// List reads every VM record, newest first. Unreadable ones are skipped.
func (rs Records) List() []*Record {
	ents, _ := os.ReadDir(rs.Paths.VMs())
	var recs []*Record
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := Read(filepath.Join(rs.Paths.VMs(), e.Name()))
		if err != nil || r.ID != e.Name() {
			continue
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Created.After(recs[j].Created) })
	return recs
}

// Pruned is what Prune removed and kept.
type Pruned struct {
	Removed    []string
	Kept       int
	FreedBytes int64
}

// Prune removes the directories of recs (newest first) past the newest
// keepLast that are Prunable at now; clean is called first for each that
// is not Busy, to remove what its run may have left outside its directory.
func (rs Records) Prune(recs []*Record, keepLast int, now time.Time, log *slog.Logger, clean func(*Record)) Pruned {
	res := Pruned{Removed: []string{}}
	for i, r := range recs {
		if !r.Busy() {
			clean(r)
		}
		if i < keepLast || !r.Prunable(now) {
			res.Kept++
			continue
		}
		dir := rs.Paths.VM(r.ID)
		if !strings.HasPrefix(r.ID, "vm-") || filepath.Base(dir) != r.ID {
			res.Kept++
			continue
		}
		freed := paths.DirBytes(dir)
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("removing vm record", "vm", r.ID, "err", err)
			res.Kept++
			continue
		}
		res.Removed = append(res.Removed, r.ID)
		res.FreedBytes += freed
	}
	return res
}
