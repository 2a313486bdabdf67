package warmpool

import (
	"testing"

	"isopod/integration/e2e"
)

// slotAttack writes 4 MiB at MiB offsets into the guest's writable disk
// slots, past the ends of the files its run asked for: the workspace's
// writable layer (the run has none, so its slot's file is a placeholder)
// and the scratch disk (1024 MiB). Each write is synced, so that one the
// VMM refuses fails here.
const slotAttack = `dev() { for d in /sys/block/vd*; do [ "$(cat $d/serial)" = "$1" ] && echo /dev/${d##*/}; done; }
try() { if dd if=/dev/zero of="$(dev $1)" bs=1M count=4 seek=$2 conv=fsync 2>/dev/null; then echo "$1 $2 written"; else echo "$1 $2 refused"; fi; }
try isopod-ws-upper 0; try isopod-ws-upper 20000; try isopod-scratch 1024; try isopod-scratch 20000`

const slotAttackRefused = "isopod-ws-upper 0 refused\nisopod-ws-upper 20000 refused\n" +
	"isopod-scratch 1024 refused\nisopod-scratch 20000 refused\n"

// TestGuestWritesNothingPastItsDisks: whichever way a run's VM came to be,
// its guest cannot make the VMM write past the ends of the disks the run
// asked for, though a VM resumed from a snapshot sees every disk slot as
// large as the snapshot VM did (64 GiB): so a guest fills no more of the
// host's disk than its scratch disk. The cases: a snapshot VM that runs
// on as its run's (a plain and an assembled snapshot's), a clone of each,
// and a clone resumed in the VM directory where its shape's snapshot VM
// ran just before (a stage's fork, the first of its shape).
func TestGuestWritesNothingPastItsDisks(t *testing.T) {
	e2e.RequireVM(t)
	env := warmHome(t)
	for _, tt := range []struct {
		what             string
		path             string
		built, assembled bool
	}{
		{"the run that builds its shape's snapshot and runs on in its VM", "cold", true, false},
		{"a clone of that snapshot", "warm", false, false},
		{"the run that builds its shape's assembled snapshot and runs on in its VM", "warm", true, true},
		{"a clone of the assembled snapshot", "warm", false, true},
	} {
		r := warmRun(t, env, "--no-network", "--", "sh", "-c", slotAttack)
		wantPath(t, r, tt.path, tt.built)
		if got := r.JSON["root_assembled"] == true; got != tt.assembled {
			t.Errorf("%s: root_assembled %v; want %v", tt.what, got, tt.assembled)
		}
		if out := e2e.Str(r.JSON, "stdout"); out != slotAttackRefused {
			t.Errorf("%s: the guest's writes past its disks:\n%s\nwant every one refused", tt.what, out)
		}
	}
	// A fork of a stage in a shape of its own: its run builds the shape's
	// snapshot in its VM directory, then resumes a clone there.
	warmRun(t, env, "--no-network", "--commit-as", "slots", "--", "true")
	r := warmRun(t, env, "--no-network", "--mem-mib", "384", "--stage", "slots", "--", "sh", "-c", slotAttack)
	wantPath(t, r, "warm", true)
	if out := e2e.Str(r.JSON, "stdout"); out != slotAttackRefused {
		t.Errorf("a fork that built its shape's snapshot, then resumed: the guest's writes past its disks:\n%s\nwant every one refused", out)
	}
}
