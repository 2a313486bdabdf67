package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	"isopod/internal/vmm"
	"isopod/internal/vmm/vmmfake"
)

// Service.Run on the CPU alone: the VMM is vmmfake, whose guest is the
// real agent running host programs. What needs a guest kernel (the
// overlay root, disks, the network inside the guest) is left to the VM
// tests.

func TestRunCold(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	rep := run(t, s, sandbox.Request{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}, NoNetwork: true})
	if code(rep) != 3 || rep.Stdout != "out\n" || rep.Stderr != "err\n" || rep.TimedOut || rep.GuestDied {
		t.Errorf("report: code %d stdout %q stderr %q timed out %v died %v; want 3, out, err", code(rep), rep.Stdout, rep.Stderr, rep.TimedOut, rep.GuestDied)
	}
	if rep.Path != "cold" || rep.BootMS == nil || rep.ResumeMS != nil || rep.SnapshotBuilt {
		t.Errorf("path %q boot %v resume %v; want a cold boot", rep.Path, rep.BootMS, rep.ResumeMS)
	}
	if rep.VMM.Name != vmmfake.Name || rep.Accel != vmm.AccelTCG || rep.Net != nil || rep.GuestIP != "" {
		t.Errorf("vmm %+v accel %q net %+v ip %q; want the fake, tcg and no network", rep.VMM, rep.Accel, rep.Net, rep.GuestIP)
	}
	if b, err := os.ReadFile(rep.StdoutLogPath); err != nil || string(b) != "out\n" {
		t.Errorf("stdout log %q, %v; want out", b, err)
	}

	ms := d.Machines()
	if len(ms) != 1 {
		t.Fatalf("%d machines started; want 1", len(ms))
	}
	m := ms[0]
	st := m.State()
	if st.Hostname != rep.Name || st.Clock.IsZero() || st.Net != nil {
		t.Errorf("guest state %+v; want the run's name from the command line, a clock, no network", st)
	}
	if st.Mount == nil || st.Mount.Layers != 0 || !st.Mount.Scratch || st.Mount.Flush {
		t.Errorf("mount %+v; want the scratch disk as the upper layer, nothing to flush after a boot", st.Mount)
	}
	var serials []string
	for _, disk := range m.Config().Disks {
		serials = append(serials, disk.Serial)
	}
	if want := []string{agentproto.SerialBase, agentproto.SerialScratch}; !slices.Equal(serials, want) {
		t.Errorf("disks %v; want %v", serials, want)
	}
	if err := m.Wait(); !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("machine after the run: %v; want killed", err)
	}

	// The record names no VMM process (the fake has none), so gc finds
	// nothing to kill and prunes the finished record.
	gc, err := s.VMGC(context.Background(), 0)
	if err != nil || len(gc.KilledVMMs) != 0 || !slices.Contains(gc.Removed, rep.VMID) {
		t.Errorf("vm gc: %+v, %v; want the record removed and nothing killed", gc, err)
	}
}

// The default shape of run is warm-eligible: the first builds the
// snapshot and runs on in its VM, the second only resumes.
func TestRunWarm(t *testing.T) {
	t.Parallel()
	s, d := newFakeService(t, vmmfake.Config{})
	first := run(t, s, sandbox.Request{Argv: []string{"echo", "one"}})
	if first.Path != "cold" || !first.SnapshotBuilt || first.SnapshotBuildMS == nil || first.BootMS == nil || first.ResumeMS != nil || first.Stdout != "one\n" {
		t.Fatalf("first run: path %q built %v boot %v resume %v stdout %q warnings %q; want a snapshot built by a boot that ran on",
			first.Path, first.SnapshotBuilt, first.BootMS, first.ResumeMS, first.Stdout, first.Warnings)
	}
	second := run(t, s, sandbox.Request{Argv: []string{"echo", "two"}})
	if second.Path != "warm" || second.SnapshotBuilt || second.ResumeMS == nil || second.BootMS != nil || second.Stdout != "two\n" {
		t.Errorf("second run: path %q built %v resume %v boot %v stdout %q; want a resume only",
			second.Path, second.SnapshotBuilt, second.ResumeMS, second.BootMS, second.Stdout)
	}
	if second.Net == nil || second.GuestIP == "" {
		t.Errorf("net %+v ip %q; want a networked run", second.Net, second.GuestIP)
	}

	ms := d.Machines()
	if len(ms) != 2 || ms[0].Restored() || !ms[1].Restored() {
		t.Fatalf("machines: %d; want the snapshot builder, which ran the first command, and a restored guest", len(ms))
	}
	list, err := s.WarmList(context.Background())
	if err != nil || len(list.Snapshots) != 1 || list.Snapshots[0].Stale {
		t.Fatalf("warm list: %+v, %v; want one current snapshot", list, err)
	}
	snap, err := vmmfake.SnapshotState(list.Snapshots[0].Path)
	if err != nil || snap.Net == nil || len(snap.Net.Env) != 0 || snap.Mount != nil || snap.EntropyBytes != 0 || snap.Hostname == first.Name {
		t.Errorf("the snapshot's guest %+v, %v; want its network configured without a run's env, nothing mounted, made its own by no run", snap, err)
	}
	// The snapshot VM that ran on and a resumed clone are each made their
	// own machine before the command, and assemble their root from the
	// disks they were given, flushing first.
	for i, rep := range []*report.Run{first, second} {
		st := ms[i].State()
		if st.Hostname != rep.Name || st.EntropyBytes < 64 || st.Clock.IsZero() || st.Net == nil {
			t.Errorf("run %d's guest state %+v; want the run's hostname, fresh entropy, a clock and the network", i+1, st)
		}
		if st.Mount == nil || !st.Mount.Flush || !st.Mount.Scratch {
			t.Errorf("run %d's mount %+v; want a flushed mount with a scratch disk", i+1, st.Mount)
		}
	}
	// The snapshot VM that ran on had its writable slots cut before the
	// command: its scratch disk back to its size, the unused one to
	// nothing. A clone's come that way.
	got, scratch := ms[0].Resized(), diskOf(t, ms[0], agentproto.SerialScratch)
	if n, ok := got[scratch]; len(got) != 2 || !ok || n <= 0 || n >= machine.SlotBytes || got[diskOf(t, ms[0], agentproto.SerialWorkspaceUpper)] != 0 {
		t.Errorf("the snapshot VM that ran on resized its disks %v; want its scratch (%d) cut below the slot's size, its workspace's writable slot to 0", got, scratch)
	}
	if got := ms[1].Resized(); len(got) != 0 {
		t.Errorf("a clone resized its disks %v; want none", got)
	}
}

// diskOf is the index of m's disk with serial.
func diskOf(t *testing.T, m *vmmfake.Machine, serial string) int {
	t.Helper()
	i := slices.IndexFunc(m.Config().Disks, func(d vmm.Disk) bool { return d.Serial == serial })
	if i < 0 {
		t.Fatalf("the machine has no disk %s", serial)
	}
	return i
}

// A snapshot VM whose disk slots cannot be cut does not run on: the run
// resumes a clone of the snapshot it built.
func TestRunWarmSlotsNotCut(t *testing.T) {
	t.Parallel()
	s, d := newFakeService(t, vmmfake.Config{FailResize: func(*vmmfake.Machine, int) error {
		return errors.New("no resize")
	}})
	rep := run(t, s, sandbox.Request{Argv: []string{"echo", "one"}})
	if rep.Path != "warm" || !rep.SnapshotBuilt || rep.ResumeMS == nil || rep.Stdout != "one\n" {
		t.Errorf("path %q built %v resume %v stdout %q; want a snapshot built and a clone of it resumed",
			rep.Path, rep.SnapshotBuilt, rep.ResumeMS, rep.Stdout)
	}
	if ms := d.Machines(); len(ms) != 2 || !ms[1].Restored() {
		t.Errorf("machines: %d; want the snapshot VM and a clone", len(ms))
	}
}

// A snapshot that cannot be built leaves the run to a cold boot, with a
// warning.
func TestRunWarmSnapshotFails(t *testing.T) {
	t.Parallel()
	s, _ := newFakeService(t, vmmfake.Config{FailSnapshot: func(*vmmfake.Machine, string) error {
		return errors.New("disk full")
	}})
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}})
	if rep.Path != "cold" || code(rep) != 0 || rep.SnapshotBuilt {
		t.Errorf("path %q code %d built %v; want a cold run", rep.Path, code(rep), rep.SnapshotBuilt)
	}
	if !slices.ContainsFunc(rep.Warnings, func(w string) bool { return strings.Contains(w, "disk full") }) {
		t.Errorf("warnings %q; want the failed snapshot build", rep.Warnings)
	}
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	s, _ := newFakeService(t, vmmfake.Config{})
	start := time.Now()
	rep := run(t, s, sandbox.Request{Argv: []string{"sh", "-c", "echo started; sleep 30"}, NoNetwork: true, TimeoutS: 1})
	if !rep.TimedOut || rep.ExitCode != nil || rep.Signal == nil || *rep.Signal != int(syscall.SIGKILL) || rep.Stdout != "started\n" {
		t.Errorf("report: timed out %v code %v signal %v stdout %q; want timed out and killed with its output", rep.TimedOut, rep.ExitCode, rep.Signal, rep.Stdout)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("a 1 s run took %v", d)
	}
}

// A guest that never says hello within the run's timeout is a timed-out
// report, not an error.
func TestRunBootTimeout(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{BootDelay: time.Hour})
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, TimeoutS: 1})
	if !rep.TimedOut || rep.ExitCode != nil || rep.BootMS != nil {
		t.Errorf("report: timed out %v code %v boot %v; want timed out before the guest was ready", rep.TimedOut, rep.ExitCode, rep.BootMS)
	}
	if ms := d.Machines(); len(ms) != 1 || !errors.Is(ms[0].Wait(), vmmfake.ErrKilled) {
		t.Errorf("machines %d; want the one that never booted, killed", len(ms))
	}
}

func TestRunBootError(t *testing.T) {
	t.Parallel()
	s, _ := newFakeService(t, vmmfake.Config{BootError: "no disk with serial isopod-base"})
	_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true})
	if !errors.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "no disk with serial isopod-base") {
		t.Errorf("Run: %v; want ErrFailedPrecondition with the guest's boot error", err)
	}
}

// The fake guest's files are the host's: the command writes a file that
// copy-out brings to another host path.
func TestRunCopyOut(t *testing.T) {
	t.Parallel()
	s, _ := newFakeService(t, vmmfake.Config{})
	dir := t.TempDir()
	guest, host := filepath.Join(dir, "guest.txt"), filepath.Join(dir, "out", "host.txt")
	if err := os.Mkdir(filepath.Dir(host), 0o755); err != nil {
		t.Fatal(err)
	}
	rep := run(t, s, sandbox.Request{
		Argv:      []string{"sh", "-c", "printf 'made in the guest' > " + guest + "; chmod 640 " + guest},
		NoNetwork: true,
		CopyOut:   []sandbox.CopyOut{{Guest: guest, Host: host}},
	})
	if code(rep) != 0 || len(rep.Copied) != 1 || rep.Copied[0].Bytes != int64(len("made in the guest")) || rep.CopyOutMS == nil {
		t.Fatalf("report: code %d copied %+v; want one file copied", code(rep), rep.Copied)
	}
	b, err := os.ReadFile(host)
	if err != nil || string(b) != "made in the guest" {
		t.Errorf("host file %q, %v; want the guest's", b, err)
	}
	if st, err := os.Stat(host); err != nil || st.Mode().Perm() != 0o640 {
		t.Errorf("host file mode %v, %v; want 0640", st.Mode(), err)
	}

	// A guest file that is not there fails the run and leaves nothing.
	missing := filepath.Join(dir, "out", "missing.txt")
	_, err = runErr(t, s, sandbox.Request{
		Argv: []string{"true"}, NoNetwork: true,
		CopyOut: []sandbox.CopyOut{{Guest: filepath.Join(dir, "nope"), Host: missing}},
	})
	var coe *machine.CopyOutError
	if !errors.As(err, &coe) {
		t.Errorf("Run with a missing guest file: %v; want a copy-out error", err)
	}
	if _, err := os.Stat(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a failed copy-out left %s (%v)", missing, err)
	}
}

// A commit that cannot happen is refused before any VM starts.
func TestRunCommitRefusedBeforeBoot(t *testing.T) {
	t.Parallel()
	s, d := newColdService(t, vmmfake.Config{})
	rep := run(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CommitAs: "tools"})
	if rep.StageID == "" || rep.CommitError != "" {
		t.Fatalf("commit run: stage %q error %q; want a stage", rep.StageID, rep.CommitError)
	}
	// The host kills the VMM once the guest has answered the halt, so the
	// machine may have powered off on its own or been killed after it.
	if ms := d.Machines(); len(ms) != 1 || ms[0].State().Syncs != 1 {
		t.Errorf("the committing guest was not halted with a sync (machines %d)", len(ms))
	} else if err := ms[0].Wait(); err != nil && !errors.Is(err, vmmfake.ErrKilled) {
		t.Errorf("the committing machine stopped with %v; want a halt", err)
	}
	for _, tt := range []struct {
		name, label string
		want        error
	}{
		{"taken", "tools", errdefs.ErrAlreadyExists},
		{"reserved", "base", errdefs.ErrInvalidArgument},
		{"looks like a flag", "-x", errdefs.ErrInvalidArgument},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := len(d.Machines())
			_, err := runErr(t, s, sandbox.Request{Argv: []string{"true"}, NoNetwork: true, CommitAs: tt.label})
			if !errors.Is(err, tt.want) {
				t.Errorf("Run --commit-as %q: %v; want %v", tt.label, err, tt.want)
			}
			if n := len(d.Machines()); n != before {
				t.Errorf("%d machines started for a refused run", n-before)
			}
		})
	}
}

// A guest that dies while its command runs (here: the fake crashes once
// the command has started).
func TestRunGuestDiesMidExec(t *testing.T) {
	t.Parallel()
	started := filepath.Join(t.TempDir(), "started")
	panicked := errors.New("Kernel panic - not syncing: Attempted to kill init! exitcode=0x00000009")
	s, _ := newFakeService(t, vmmfake.Config{OnRequest: func(m *vmmfake.Machine, msg *agentproto.Msg) {
		if msg.Kind != agentproto.KindExec || !slices.ContainsFunc(msg.Exec.Argv, func(a string) bool { return strings.Contains(a, started) }) {
			return
		}
		go func() {
			for range 500 {
				if _, err := os.Stat(started); err == nil {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			time.Sleep(time.Second) // for the output to leave, on a loaded host too
			m.Crash(panicked)
		}()
	}})
	rep, err := runErr(t, s, sandbox.Request{
		Argv: []string{"sh", "-c", "echo before; touch " + started + "; sleep 30"}, NoNetwork: true,
	})
	// A guest that dies is a result, with the output that arrived and the
	// console's last words as the reason.
	if err != nil {
		t.Fatalf("Run: %v; want a report", err)
	}
	if !rep.GuestDied || rep.ExitCode != nil || rep.TimedOut || rep.Stdout != "before\n" {
		t.Errorf("report: died %v code %v timed out %v stdout %q; want the guest's death with the output so far", rep.GuestDied, rep.ExitCode, rep.TimedOut, rep.Stdout)
	}
	if want := "kernel panic: Attempted to kill init!"; !strings.HasPrefix(rep.GuestDiedReason, want) {
		t.Errorf("reason %q; want it to start with %q", rep.GuestDiedReason, want)
	}
}

// A run whose time runs out while the guest assembles its root, cold or
// warm, ends in a timed-out report, not an error.
func TestRunTimesOutDuringRootAssembly(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{false, true} {
		t.Run(fmt.Sprintf("warm=%v", warm), func(t *testing.T) {
			t.Parallel()
			var slow atomic.Bool
			s, _ := newFake(t, vmmfake.Config{OnRequest: func(_ *vmmfake.Machine, msg *agentproto.Msg) {
				if msg.Kind == agentproto.KindMount && slow.Load() {
					time.Sleep(1500 * time.Millisecond)
				}
			}}, !warm)
			if warm {
				// The first run builds the snapshot the second resumes.
				if rep := run(t, s, sandbox.Request{Argv: []string{"true"}}); !rep.SnapshotBuilt {
					t.Fatalf("first run built no snapshot (path %q)", rep.Path)
				}
			}
			slow.Store(true)
			rep := run(t, s, sandbox.Request{Argv: []string{"sleep", "100"}, TimeoutS: 1, CommitAs: "never"})
			if !rep.TimedOut || rep.ExitCode != nil || rep.StageID != "" {
				t.Errorf("report: timed out %v, exit code %v, stage %q; want a timed-out run that committed nothing", rep.TimedOut, rep.ExitCode, rep.StageID)
			}
			if want := map[bool]string{false: "cold", true: "warm"}[warm]; rep.Path != want {
				t.Errorf("path %q; want %q", rep.Path, want)
			}
		})
	}
}
