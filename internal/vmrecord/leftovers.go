package vmrecord

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"isopod/internal/machine"
	"isopod/internal/vmnet"
	"isopod/internal/workspace"
)

// What `isopod vm gc` finds of runs whose process died: VMMs still
// running without their owner, and what a run leaves outside its
// directory's record. The core adds the VMMs' cgroups, which its jail
// knows.

// KillOrphans kills the VMM of every record of recs whose owner is gone
// while its VMM (the same process, by pid and start time) still runs, and
// returns their pids.
func KillOrphans(recs []*Record, log *slog.Logger) []int {
	killed := []int{}
	for _, r := range recs {
		if Alive(r.OwnerPID, r.OwnerStartTime) || !Alive(r.VMMPID, r.VMMStartTime) {
			continue
		}
		if err := syscall.Kill(r.VMMPID, syscall.SIGKILL); err == nil {
			killed = append(killed, r.VMMPID)
			log.Info("killed orphaned VMM", "vm", r.ID, "pid", r.VMMPID)
			for i := 0; i < 100 && Alive(r.VMMPID, r.VMMStartTime); i++ {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}
	return killed
}

// CleanLeftovers removes what a run that is over may have left outside its
// record when its process died: its scratch and placeholder disks, its
// socket directory, its workspace copy on the tmpfs, and the staging files
// of a copy-out it was writing.
func (rs Records) CleanLeftovers(r *Record) {
	os.Remove(filepath.Join(rs.Paths.VM(r.ID), "scratch.ext4"))
	for _, name := range machine.PlaceholderNames {
		os.Remove(filepath.Join(rs.Paths.VM(r.ID), name))
	}
	if base, err := vmnet.SocketBase(rs.Paths.Scope()); err == nil {
		if strings.HasPrefix(r.ID, "vm-") {
			os.RemoveAll(filepath.Join(base, r.ID))
		}
		vmnet.DropSocketBase(base)
	}
	if strings.HasPrefix(r.ID, "vm-") {
		workspace.RemoveWork(r.ID)
	}
	for _, p := range r.Staging {
		if machine.IsStagingName(filepath.Base(p), r.OwnerPID) {
			os.Remove(p)
		}
	}
}

// SweepSocketDirs removes the socket directories of runs that ended
// without cleaning up (a SIGKILLed isopod). A socket path is only used
// while the VMM connects, so removing an old one never breaks a live VM.
func (rs Records) SweepSocketDirs() {
	base, err := vmnet.SocketBase(rs.Paths.Scope())
	if err != nil {
		return
	}
	ents, _ := os.ReadDir(base)
	for _, e := range ents {
		info, err := e.Info()
		if err != nil || !e.IsDir() || !strings.HasPrefix(e.Name(), "vm-") || time.Since(info.ModTime()) < GCMinAge {
			continue
		}
		if r, err := Read(rs.Paths.VM(e.Name())); err == nil && r.Busy() {
			continue
		}
		os.RemoveAll(filepath.Join(base, e.Name()))
	}
	vmnet.DropSocketBase(base)
}

// Busy reports whether the VM id still belongs to a run: its record is
// Busy, or it has a directory but no record yet (a run between making the
// one and writing the other). Its record is read afresh.
func (rs Records) Busy(id string) bool {
	r, err := Read(rs.Paths.VM(id))
	if err != nil {
		_, serr := os.Stat(rs.Paths.VM(id))
		return serr == nil
	}
	return r.Busy()
}
