package sandbox

import (
	"context"
	"strings"
	"time"

	"isopod/internal/image"
	"isopod/internal/report"
	"isopod/internal/session"
	"isopod/internal/vmrecord"
)

// VMGC kills orphaned VMM processes and prunes all but the newest keepLast
// records. A record still busy (vmrecord.Record.Busy) is never pruned; a finished
// one is prunable at once, even while its owner lives.
func (s *Service) VMGC(ctx context.Context, keepLast int) (*report.VMGC, error) {
	if keepLast < 0 {
		return nil, invalid("--keep-last %d: must be 0 or more (0 keeps no finished record)", keepLast)
	}
	res := &report.VMGC{OK: true}
	// The jail (when on) knows where dead VMMs' cgroups are.
	s.driver(ctx)
	rs := vmrecord.Records{Paths: s.opts.Paths}
	recs := rs.List()
	res.KilledVMMs = vmrecord.KillOrphans(recs, s.log)
	pr := rs.Prune(recs, keepLast, time.Now(), s.log, func(r *vmrecord.Record) {
		rs.CleanLeftovers(r)
		if s.jailer != nil {
			s.jailer.RemoveCgroup(s.jailer.CgroupName(r.ID))
		}
	})
	res.Removed, res.Kept, res.FreedBytes = pr.Removed, pr.Kept, pr.FreedBytes
	if st, err := s.store.Open(); err == nil {
		if left, err := st.GC(ctx); err == nil {
			res.StageLeftovers = left
		}
	}
	s.gcExtra(res)
	rs.SweepSocketDirs()
	s.gcCgroups(rs)
	return res, nil
}

// gcCgroups removes the VMM cgroups of runs that are over, found by name
// (a run killed before its record knew its VMM's pid leaves one no record
// points at), killing any VMM still in one. A run's record is read again
// for each, so that a run that started meanwhile keeps its own.
func (s *Service) gcCgroups(rs vmrecord.Records) {
	if s.jailer == nil {
		return
	}
	removed := s.jailer.SweepCgroups(func(id string) bool {
		return !strings.HasPrefix(id, "vm-") || rs.Busy(id)
	})
	for _, name := range removed {
		s.log.Info("removed a dead VMM's cgroup", "cgroup", name)
	}
}

// gcExtra is the housekeeping beyond VM records: warm-pool snapshots and
// the leftovers of interrupted kernel fetches and image builds.
func (s *Service) gcExtra(res *report.VMGC) {
	// Warm pool: temporary and replaced snapshot directories, incomplete
	// ones, and snapshots whose base build is gone (warmpool.go).
	for _, name := range s.gcWarm() {
		s.log.Info("warm pool: removed leftover snapshot", "name", name)
		res.SnapshotsRemoved = append(res.SnapshotsRemoved, name)
	}
	res.BuildLeftovers = image.SweepTemp(s.opts.Paths, image.TempMaxAge, s.log)
	res.SessionsRemoved = session.Store{Paths: s.opts.Paths}.Prune()
}
