package warmpool

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"isopod/integration/e2e"
)

// filesCmd prints a digest of every path a run can see (the root, /tmp,
// /run and /dev/shm), then when the root's top directory last changed.
const filesCmd = "find / /tmp /run /dev/shm -xdev | sort | md5sum; date -r / +%s"

// A ready VM has run before its claim: its root was assembled before the
// call, yet the run sees the files a plain resume sees (nothing the
// warm-up could have made), and a boot id and random bytes of its own
// (clones.check), claim after claim; a waiting one idles.
func TestMCPReadyVMsHaveRun(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	s := startMCP(t, env, "--max-vms", "2")
	c := newClones()

	s.run(t, c, "first call", nil, "true")
	waitFor(t, "snapshot built in the background", 5*time.Minute, func() bool { return len(listSnapshots(t, env)) == 1 })
	rep, out := s.run(t, c, "plain resume", nil, filesCmd)
	if rep["path"] != "warm" || rep["ready_vm"] == true {
		t.Fatalf("plain resume: path %v ready_vm %v", rep["path"], rep["ready_vm"])
	}
	plainFiles, _, _ := strings.Cut(out, "\n")

	for i := 0; i < 2; i++ {
		what := fmt.Sprintf("ready call %d", i)
		waitFor(t, "ready VM", 3*time.Minute, func() bool { return s.readyVMs(t) >= 1 })
		// The call starts in a later second than the ready VM's root was
		// assembled in, so that the root's age shows in whole seconds.
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		before := time.Now()
		rep, out := s.run(t, c, what, nil, filesCmd)
		if rep["ready_vm"] != true {
			t.Fatalf("%s: ready_vm %v; want a ready VM", what, rep["ready_vm"])
		}
		files, root, _ := strings.Cut(out, "\n")
		if files != plainFiles {
			t.Errorf("%s sees files %q, a plain resume %q: something ran before the claim left them (stderr %q)", what, files, plainFiles, rep["stderr"])
		}
		secs, err := strconv.ParseInt(strings.TrimSpace(root), 10, 64)
		if err != nil || secs >= before.Unix() {
			t.Errorf("%s: root assembled at %q, not before the call (%d): the ready VM had not run", what, root, before.Unix())
		}
	}

	// Nor can a ready VM's guest write past the disks its call has
	// (slots_test.go).
	waitFor(t, "ready VM", 3*time.Minute, func() bool { return s.readyVMs(t) >= 1 })
	if rep, out := s.run(t, c, "ready call writing past its disks", nil, slotAttack); rep["ready_vm"] != true || out != slotAttackRefused {
		t.Errorf("a ready VM's guest wrote past its disks (ready_vm %v):\n%s\nwant every write refused", rep["ready_vm"], out)
	}

	// A waiting ready VM idles: its QEMU takes a sliver of a core (a guest
	// spinning or a busy timer would take most of one).
	waitFor(t, "ready VM", 3*time.Minute, func() bool { return s.readyVMs(t) >= 1 })
	pids := e2e.VMMsOf(s.home)
	if len(pids) != 1 {
		t.Fatalf("%d VMMs with one ready VM waiting", len(pids))
	}
	if pct := idleCost(t, pids[0], 5*time.Second); pct >= 10 {
		t.Errorf("a waiting ready VM's QEMU takes %.1f %% of a core; want it idle", pct)
	}
}
