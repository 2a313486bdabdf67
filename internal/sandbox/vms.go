package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"isopod/internal/image"
	"isopod/internal/machine"
	"isopod/internal/paths"
)

// gcMinAge keeps unfinished records this young even past keep-last and even
// when their owner is gone: a run may be starting. A finished record has no
// such grace.
const gcMinAge = 60 * time.Second

// VMList lists VM records newest first.
func (s *Service) VMList(ctx context.Context) (*VMListResult, error) {
	recs := s.records()
	res := &VMListResult{OK: true, VMs: []VMEntry{}}
	for _, r := range recs {
		res.VMs = append(res.VMs, VMEntry{
			ID: r.ID, Name: r.Name, Created: r.Created.Format(time.RFC3339), Argv: r.Argv,
			Live: vmmRunning(r), DirBytes: paths.DirBytes(s.opts.Paths.VM(r.ID)), ExitCode: r.ExitCode,
		})
	}
	return res, nil
}

// records reads every VM record, newest first. Unreadable ones are skipped.
func (s *Service) records() []*vmRecord {
	ents, _ := os.ReadDir(s.opts.Paths.VMs())
	var recs []*vmRecord
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := readRecord(filepath.Join(s.opts.Paths.VMs(), e.Name()))
		if err != nil || r.ID != e.Name() {
			continue
		}
		recs = append(recs, r)
	}
	sort.Slice(recs, func(i, j int) bool { return recs[i].Created.After(recs[j].Created) })
	return recs
}

// vmmRunning reports whether r's VMM process (by pid and start time) still
// runs: what a listing calls live. The owner is not asked: a long-lived
// owner (the MCP server) outlives every VM it ran.
func vmmRunning(r *vmRecord) bool {
	return alive(r.VMMPID, r.VMMStartTime)
}

// recordBusy reports whether r still belongs to a run: its VMM runs, or it
// is unfinished and its owner lives (a run between boots, or one whose VMM
// has not started yet).
func recordBusy(r *vmRecord) bool {
	return vmmRunning(r) || (!r.Finished && alive(r.OwnerPID, r.OwnerStartTime))
}

// prunable reports whether r may be removed past keep-last: nothing runs
// it, and it is finished, or its owner is known to be gone (it died
// mid-run), or it is older than gcMinAge.
func prunable(r *vmRecord, now time.Time) bool {
	if recordBusy(r) {
		return false
	}
	return r.Finished || r.OwnerPID > 0 && r.OwnerStartTime > 0 || now.Sub(r.Created) >= gcMinAge
}

// VMGC kills orphaned VMM processes and prunes all but the newest keepLast
// records. A record still busy (see recordBusy) is never pruned; a finished
// one is prunable at once, even while its owner lives.
func (s *Service) VMGC(ctx context.Context, keepLast int) (*VMGCResult, error) {
	if keepLast < 0 {
		return nil, invalid("--keep-last %d: must be 0 or more (0 keeps no finished record)", keepLast)
	}
	res := &VMGCResult{OK: true, Removed: []string{}, KilledVMMs: []int{}}
	// The jail (when on) knows where dead VMMs' cgroups are.
	s.driver(ctx)
	recs := s.records()
	for _, r := range recs {
		// An orphan: its owner is gone but its VMM (the same process, by
		// pid and start time) still runs.
		if !alive(r.OwnerPID, r.OwnerStartTime) && alive(r.VMMPID, r.VMMStartTime) {
			if err := syscall.Kill(r.VMMPID, syscall.SIGKILL); err == nil {
				res.KilledVMMs = append(res.KilledVMMs, r.VMMPID)
				s.log.Info("killed orphaned VMM", "vm", r.ID, "pid", r.VMMPID)
				for i := 0; i < 100 && alive(r.VMMPID, r.VMMStartTime); i++ {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}
	}
	now := time.Now()
	for i, r := range recs {
		if !recordBusy(r) {
			s.cleanLeftovers(r)
		}
		if i < keepLast || !prunable(r, now) {
			res.Kept++
			continue
		}
		dir := s.opts.Paths.VM(r.ID)
		if !strings.HasPrefix(r.ID, "vm-") || filepath.Base(dir) != r.ID {
			res.Kept++
			continue
		}
		freed := paths.DirBytes(dir)
		if err := os.RemoveAll(dir); err != nil {
			s.log.Warn("removing vm record", "vm", r.ID, "err", err)
			res.Kept++
			continue
		}
		res.Removed = append(res.Removed, r.ID)
		res.FreedBytes += freed
	}
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
		r, err := readRecord(s.opts.Paths.VM(id))
		if err != nil {
			// A run between making its directory and its record.
			_, serr := os.Stat(s.opts.Paths.VM(id))
			return serr == nil
		}
		return recordBusy(r)
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
		if err != nil || !e.IsDir() || !strings.HasPrefix(e.Name(), "vm-") || time.Since(info.ModTime()) < gcMinAge {
			continue
		}
		if r, err := readRecord(s.opts.Paths.VM(e.Name())); err == nil && recordBusy(r) {
			continue
		}
		os.RemoveAll(filepath.Join(base, e.Name()))
	}
}

// cleanLeftovers removes what a run that is over may have left outside its
// record when its process died: its scratch and placeholder disks, its
// socket directory, the staging files of a copy-out it was writing, and its
// VMM's cgroup.
func (s *Service) cleanLeftovers(r *vmRecord) {
	os.Remove(filepath.Join(s.opts.Paths.VM(r.ID), "scratch.ext4"))
	for _, name := range machine.PlaceholderNames {
		os.Remove(filepath.Join(s.opts.Paths.VM(r.ID), name))
	}
	if base, err := machine.SocketBase(s.opts.Paths.Scope()); err == nil && strings.HasPrefix(r.ID, "vm-") {
		os.RemoveAll(filepath.Join(base, r.ID))
	}
	if strings.HasPrefix(r.ID, "vm-") {
		removeWorkspaceWork(r.ID)
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
