package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"isopod/internal/image"
	"isopod/internal/machine"
	"isopod/internal/vmrecord"
	"isopod/internal/workspace"
)

// VMGCResult is what `isopod vm gc` removed and kept.
type VMGCResult struct {
	OK             bool     `json:"ok"`
	Removed        []string `json:"removed"`
	Kept           int      `json:"kept"`
	KilledVMMs     []int    `json:"killed_vmm_pids"`
	FreedBytes     int64    `json:"freed_bytes"`
	StageLeftovers []string `json:"stage_leftovers_removed,omitempty"`
	// SnapshotsRemoved are warm-pool snapshots no current run can use.
	SnapshotsRemoved []string `json:"snapshots_removed,omitempty"`
	// BuildLeftovers are what interrupted kernel fetches and image builds
	// left in kernels/ and images/.
	BuildLeftovers []string `json:"build_leftovers_removed,omitempty"`
}

// VMGC kills orphaned VMM processes and prunes all but the newest keepLast
// records. A record still busy (vmrecord.Record.Busy) is never pruned; a finished
// one is prunable at once, even while its owner lives.
func (s *Service) VMGC(ctx context.Context, keepLast int) (*VMGCResult, error) {
	if keepLast < 0 {
		return nil, invalid("--keep-last %d: must be 0 or more (0 keeps no finished record)", keepLast)
	}
	res := &VMGCResult{OK: true, Removed: []string{}, KilledVMMs: []int{}}
	// The jail (when on) knows where dead VMMs' cgroups are.
	s.driver(ctx)
	rs := vmrecord.Records{Paths: s.opts.Paths}
	recs := rs.List()
	for _, r := range recs {
		// An orphan: its owner is gone but its VMM (the same process, by
		// pid and start time) still runs.
		if !vmrecord.Alive(r.OwnerPID, r.OwnerStartTime) && vmrecord.Alive(r.VMMPID, r.VMMStartTime) {
			if err := syscall.Kill(r.VMMPID, syscall.SIGKILL); err == nil {
				res.KilledVMMs = append(res.KilledVMMs, r.VMMPID)
				s.log.Info("killed orphaned VMM", "vm", r.ID, "pid", r.VMMPID)
				for i := 0; i < 100 && vmrecord.Alive(r.VMMPID, r.VMMStartTime); i++ {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}
	pr := rs.Prune(recs, keepLast, time.Now(), s.log, s.cleanLeftovers)
	res.Removed, res.Kept, res.FreedBytes = pr.Removed, pr.Kept, pr.FreedBytes
	if st, err := s.stages(); err == nil {
		if left, err := st.GC(ctx); err == nil {
			res.StageLeftovers = left
		}
	}
	s.gcExtra(res)
	s.gcSocketDirs()
	s.gcCgroups()
	return res, nil
}

// gcCgroups removes the VMM cgroups of runs that are over, found by name
// (a run killed before its record knew its VMM's pid leaves one no record
// points at), killing any VMM still in one. A run's record is read again
// for each, so that a run that started meanwhile keeps its own.
func (s *Service) gcCgroups() {
	if s.jailer == nil {
		return
	}
	removed := s.jailer.SweepCgroups(func(id string) bool {
		if !strings.HasPrefix(id, "vm-") {
			return true
		}
		r, err := vmrecord.Read(s.opts.Paths.VM(id))
		if err != nil {
			// A run between making its directory and its record.
			_, serr := os.Stat(s.opts.Paths.VM(id))
			return serr == nil
		}
		return r.Busy()
	})
	for _, name := range removed {
		s.log.Info("removed a dead VMM's cgroup", "cgroup", name)
	}
}

// gcSocketDirs removes the socket directories of runs that ended without
// cleaning up (a SIGKILLed isopod). A socket path is only used while QEMU
// connects, so removing an old one never breaks a live VM.
func (s *Service) gcSocketDirs() {
	base, err := machine.SocketBase(s.opts.Paths.Scope())
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !e.IsDir() || !strings.HasPrefix(e.Name(), "vm-") || time.Since(info.ModTime()) < vmrecord.GCMinAge {
			continue
		}
		if r, err := vmrecord.Read(s.opts.Paths.VM(e.Name())); err == nil && r.Busy() {
			continue
		}
		os.RemoveAll(filepath.Join(base, e.Name()))
	}
}

// cleanLeftovers removes what a run that is over may have left outside its
// record when its process died: its scratch and placeholder disks, its
// socket directory, the staging files of a copy-out it was writing, and its
// VMM's cgroup.
func (s *Service) cleanLeftovers(r *vmrecord.Record) {
	os.Remove(filepath.Join(s.opts.Paths.VM(r.ID), "scratch.ext4"))
	for _, name := range machine.PlaceholderNames {
		os.Remove(filepath.Join(s.opts.Paths.VM(r.ID), name))
	}
	if base, err := machine.SocketBase(s.opts.Paths.Scope()); err == nil && strings.HasPrefix(r.ID, "vm-") {
		os.RemoveAll(filepath.Join(base, r.ID))
	}
	if strings.HasPrefix(r.ID, "vm-") {
		workspace.RemoveWork(r.ID)
	}
	for _, p := range r.Staging {
		if machine.IsStagingName(filepath.Base(p), r.OwnerPID) {
			os.Remove(p)
		}
	}
	if s.jailer != nil {
		s.jailer.RemoveCgroup(s.jailer.CgroupName(r.ID))
	}
}

// gcExtra is the housekeeping beyond VM records: warm-pool snapshots and
// the leftovers of interrupted kernel fetches and image builds.
func (s *Service) gcExtra(res *VMGCResult) {
	// Warm pool: temporary and replaced snapshot directories, incomplete
	// ones, and snapshots whose base build is gone (warmpool.go).
	for _, name := range s.gcWarm() {
		s.log.Info("warm pool: removed leftover snapshot", "name", name)
		res.SnapshotsRemoved = append(res.SnapshotsRemoved, name)
	}
	res.BuildLeftovers = image.SweepTemp(s.opts.Paths, image.TempMaxAge, s.log)
}
