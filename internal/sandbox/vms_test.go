package sandbox

import (
	"context"
	"errors"
	"isopod/internal/errdefs"
	"isopod/internal/image"
	"isopod/internal/vmnet"
	"isopod/internal/vmrecord"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// startSleeper starts a process that stands in for an orphaned VMM.
func startSleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd
}

// deadPID returns the pid and start time of a process that has exited.
func deadPID(t *testing.T) (int, uint64) {
	t.Helper()
	cmd := exec.Command("sleep", "10")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid, st := cmd.Process.Pid, vmrecord.ProcStartTime(cmd.Process.Pid)
	cmd.Process.Kill()
	cmd.Wait()
	if st == 0 {
		t.Fatal("no start time for a running process")
	}
	return pid, st
}

func writeTestRecord(t *testing.T, s *Service, r *vmrecord.Record) {
	t.Helper()
	dir := s.opts.Paths.VM(r.ID)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := vmrecord.Write(dir, r); err != nil {
		t.Fatal(err)
	}
}

func TestGCKillsOnlyTrueOrphans(t *testing.T) {
	s := newTestService(t)
	orphan := startSleeper(t)
	reused := startSleeper(t)
	ownerPID, ownerStart := deadPID(t)
	old := time.Now().Add(-time.Hour)

	// An orphan: owner gone, VMM pid and start time match a live process.
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000001", Created: old, OwnerPID: ownerPID, OwnerStartTime: ownerStart,
		VMMPID: orphan.Process.Pid, VMMStartTime: vmrecord.ProcStartTime(orphan.Process.Pid)})
	// A reused pid: the recorded start time does not match; never killed.
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000002", Created: old, OwnerPID: ownerPID, OwnerStartTime: ownerStart,
		VMMPID: reused.Process.Pid, VMMStartTime: vmrecord.ProcStartTime(reused.Process.Pid) + 1})
	// A live run: its owner is this process.
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000003", Created: old, OwnerPID: os.Getpid(), OwnerStartTime: vmrecord.ProcStartTime(os.Getpid())})

	res, err := s.VMGC(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.KilledVMMs) != 1 || res.KilledVMMs[0] != orphan.Process.Pid {
		t.Errorf("killed %v; want only the orphan %d", res.KilledVMMs, orphan.Process.Pid)
	}
	if err := orphan.Wait(); err == nil {
		t.Errorf("the orphan was not killed")
	}
	if !vmrecord.Alive(reused.Process.Pid, vmrecord.ProcStartTime(reused.Process.Pid)) {
		t.Errorf("a process whose start time did not match was killed")
	}
	if _, err := os.Stat(s.opts.Paths.VM("vm-00000003")); err != nil {
		t.Errorf("a live run's record was pruned")
	}
	if _, err := os.Stat(s.opts.Paths.VM("vm-00000001")); err == nil {
		t.Errorf("the orphan's record was kept with --keep-last 0")
	}
}

func TestGCKeepsNewestAndYoung(t *testing.T) {
	s := newTestService(t)
	ownerPID, ownerStart := deadPID(t)
	for i, age := range []time.Duration{3 * time.Hour, 2 * time.Hour, time.Hour, time.Second} {
		writeTestRecord(t, s, &vmrecord.Record{ID: "vm-0000010" + itoa(i), Created: time.Now().Add(-age), OwnerPID: ownerPID, OwnerStartTime: ownerStart, Finished: true})
	}
	res, err := s.VMGC(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	// Newest (1 s old) is kept by --keep-last 1 and by age; the rest go.
	if len(res.Removed) != 3 || res.Kept != 1 {
		t.Errorf("removed %v kept %d", res.Removed, res.Kept)
	}
	ents, _ := os.ReadDir(s.opts.Paths.VMs())
	if len(ents) != 1 || ents[0].Name() != "vm-00000103" {
		t.Errorf("left %v", ents)
	}
}

func TestGCRefusesNegativeKeep(t *testing.T) {
	s := newTestService(t)
	ownerPID, ownerStart := deadPID(t)
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000201", Created: time.Now().Add(-time.Hour), OwnerPID: ownerPID, OwnerStartTime: ownerStart, Finished: true})
	if _, err := s.VMGC(context.Background(), -1); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("VMGC(-1): %v; want ErrInvalidArgument", err)
	}
	if _, err := os.Stat(s.opts.Paths.VM("vm-00000201")); err != nil {
		t.Errorf("a refused gc removed a record: %v", err)
	}
}

func TestGCSweepsBuildLeftovers(t *testing.T) {
	s := newTestService(t)
	dead := filepath.Join(s.opts.Paths.Images(), ".tmp-base-debian-1")
	live := filepath.Join(s.opts.Paths.Images(), ".tmp-base-debian-2")
	for _, d := range []string{dead, live} {
		if err := os.MkdirAll(filepath.Join(d, "root"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-image.TempMaxAge - time.Minute)
	if err := os.Chtimes(dead, old, old); err != nil {
		t.Fatal(err)
	}
	res, err := s.VMGC(context.Background(), 20)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.BuildLeftovers) != 1 || res.BuildLeftovers[0] != dead {
		t.Errorf("build leftovers removed: %q; want only %s", res.BuildLeftovers, dead)
	}
	if _, err := os.Stat(live); err != nil {
		t.Errorf("a build still at work lost its directory: %v", err)
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func TestGCRemovesStaleSocketDirs(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	s := newTestService(t)
	base, err := vmnet.SocketBase(s.opts.Paths.Scope())
	if err != nil {
		t.Fatal(err)
	}
	// Another state root's run, old and unknown here, may be live: it is
	// that root's to collect.
	otherBase, err := vmnet.SocketBase("0ther5c0")
	if err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(otherBase, "vm-0000cccc")
	stale, fresh := filepath.Join(base, "vm-0000aaaa"), filepath.Join(base, "vm-0000bbbb")
	for _, d := range []string{stale, fresh, other} {
		os.Mkdir(d, 0o700)
		os.WriteFile(filepath.Join(d, "net.sock"), nil, 0o600)
	}
	old := time.Now().Add(-time.Hour)
	os.Chtimes(stale, old, old)
	os.Chtimes(other, old, old)
	if _, err := s.VMGC(context.Background(), 20); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Errorf("another state root's socket directory was removed: %v", err)
	}
	if _, err := os.Stat(stale); err == nil {
		t.Errorf("a stale socket directory was kept")
	}
	if _, err := os.Stat(fresh); err != nil {
		t.Errorf("a fresh socket directory was removed")
	}
}

// TestLiveMeansTheVMMRuns: a long-lived owner (the MCP server) does not
// keep its finished runs live or unprunable.
func TestLiveMeansTheVMMRuns(t *testing.T) {
	s := newTestService(t)
	vmmProc := startSleeper(t)
	me, meStart := os.Getpid(), vmrecord.ProcStartTime(os.Getpid())
	now := time.Now()
	recs := []*vmrecord.Record{
		// Finished a moment ago by this (still running) process.
		{ID: "vm-00000301", Created: now, OwnerPID: me, OwnerStartTime: meStart, Finished: true},
		// Still running: its VMM is up.
		{ID: "vm-00000302", Created: now.Add(-time.Second), OwnerPID: me, OwnerStartTime: meStart,
			VMMPID: vmmProc.Process.Pid, VMMStartTime: vmrecord.ProcStartTime(vmmProc.Process.Pid)},
		// Starting: unfinished, no VMM yet, owner alive.
		{ID: "vm-00000303", Created: now.Add(-2 * time.Second), OwnerPID: me, OwnerStartTime: meStart},
	}
	for _, r := range recs {
		writeTestRecord(t, s, r)
	}
	list, err := vmrecord.Records{Paths: s.opts.Paths}.VMList(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	live := map[string]bool{}
	for _, v := range list.VMs {
		live[v.ID] = v.Live
	}
	want := map[string]bool{"vm-00000301": false, "vm-00000302": true, "vm-00000303": false}
	for id, w := range want {
		if got, ok := live[id]; !ok || got != w {
			t.Errorf("%s: live %v (listed %v); want %v", id, got, ok, w)
		}
	}
	res, err := s.VMGC(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 1 || res.Removed[0] != "vm-00000301" {
		t.Errorf("removed %v; want only the finished vm-00000301", res.Removed)
	}
	for _, id := range []string{"vm-00000302", "vm-00000303"} {
		if _, err := os.Stat(s.opts.Paths.VM(id)); err != nil {
			t.Errorf("%s was pruned while its run goes on", id)
		}
	}
	if len(res.KilledVMMs) != 0 {
		t.Errorf("killed %v: the owner of that VMM lives", res.KilledVMMs)
	}
}

// TestGCPrunesAbandonedRuns: an unfinished record whose owner died is
// pruned once it is past the start-up grace, not before.
func TestGCPrunesAbandonedRuns(t *testing.T) {
	s := newTestService(t)
	dead, deadStart := deadPID(t)
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000401", Created: time.Now().Add(-time.Hour), OwnerPID: dead, OwnerStartTime: deadStart})
	// Its owner is known to be gone: no need to wait.
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000402", Created: time.Now(), OwnerPID: dead, OwnerStartTime: deadStart})
	// An owner that cannot be told: kept while young, a run may be starting.
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000403", Created: time.Now()})
	res, err := s.VMGC(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 2 || res.Kept != 1 {
		t.Errorf("removed %v, kept %d; want vm-00000401 and vm-00000402 removed, vm-00000403 kept", res.Removed, res.Kept)
	}
}

// TestGCRemovesLeftoversOfDeadRuns: a run whose process died leaves its
// scratch disk and a copy-out staging file; gc removes both even for a
// record it keeps, and leaves a live run's alone.
func TestGCRemovesLeftoversOfDeadRuns(t *testing.T) {
	s := newTestService(t)
	dead, deadStart := deadPID(t)
	dest := t.TempDir()
	part := filepath.Join(dest, ".out.isopod-"+strconv.Itoa(dead)+"-1.part")
	other := filepath.Join(dest, ".out.isopod-1-1.part") // not that run's: kept
	for _, f := range []string{part, other} {
		os.WriteFile(f, []byte("half"), 0o600)
	}
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000501", Created: time.Now(), OwnerPID: dead, OwnerStartTime: deadStart, Staging: []string{part, other}})
	scratch := filepath.Join(s.opts.Paths.VM("vm-00000501"), "scratch.ext4")
	os.WriteFile(scratch, []byte("disk"), 0o600)
	live := startSleeper(t)
	writeTestRecord(t, s, &vmrecord.Record{ID: "vm-00000502", Created: time.Now(), OwnerPID: os.Getpid(), OwnerStartTime: vmrecord.ProcStartTime(os.Getpid()),
		VMMPID: live.Process.Pid, VMMStartTime: vmrecord.ProcStartTime(live.Process.Pid)})
	liveScratch := filepath.Join(s.opts.Paths.VM("vm-00000502"), "scratch.ext4")
	os.WriteFile(liveScratch, []byte("disk"), 0o600)
	if _, err := s.VMGC(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{part, scratch} {
		if _, err := os.Stat(gone); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s left behind", gone)
		}
	}
	for _, kept := range []string{other, liveScratch} {
		if _, err := os.Stat(kept); err != nil {
			t.Errorf("%s removed: %v", kept, err)
		}
	}
}
