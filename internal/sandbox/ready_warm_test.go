package sandbox_test

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"sync"
	"testing"

	"isopod/internal/agentproto"
	"isopod/internal/sandbox"
	"isopod/internal/vmm/vmmfake"
)

// requestLog records, per machine, the requests the host sent its agent
// that make a clone its own, assemble its root or run a command (an exec
// as "exec ARGV").
type requestLog struct {
	mu  sync.Mutex
	got map[string][]string // machine id: requests in order
}

func (l *requestLog) hook(m *vmmfake.Machine, msg *agentproto.Msg) {
	var what string
	switch msg.Kind {
	case agentproto.KindAddEntropy, agentproto.KindSyncClock, agentproto.KindSetHostname,
		agentproto.KindConfigureNet, agentproto.KindSetBootID, agentproto.KindMount:
		what = string(msg.Kind)
	case agentproto.KindExec:
		what = "exec " + strings.Join(msg.Exec.Argv, " ")
	default:
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	id := m.Config().ID
	l.got[id] = append(l.got[id], what)
}

func (l *requestLog) of(id string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.got[id])
}

// waitingMachine is the one ready VM that waits for a claim.
func waitingMachine(t *testing.T, d *vmmfake.Driver) *vmmfake.Machine {
	t.Helper()
	var got []*vmmfake.Machine
	for _, m := range d.Machines() {
		select {
		case <-m.Done():
			continue
		default:
		}
		if st := m.State(); m.Restored() && st.Mount != nil && st.BootID == "" {
			got = append(got, m)
		}
	}
	if len(got) != 1 {
		t.Fatalf("%d ready VMs wait; want 1", len(got))
	}
	return got[0]
}

// sameSet reports whether got holds exactly the requests of want, in any
// order.
func sameSet(got, want []string) bool {
	return len(got) == len(want) && !slices.ContainsFunc(want, func(w string) bool { return !slices.Contains(got, w) })
}

// A ready VM runs before its claim: restored and running, it gets
// entropy, a clock and a hostname, assembles its root and runs the
// warm-up command, and gets neither a network nor a boot id. Its claim
// makes it the run's own (entropy, clock, hostname, network, a boot id of
// its own) and runs the command, with no second mount.
func TestReadyVMsRunBeforeClaim(t *testing.T) {
	t.Parallel()
	log := &requestLog{got: map[string][]string{}}
	a := newAdmission(t, 8, 8)
	s, d := newFakeWith(t, vmmfake.Config{OnRequest: log.hook}, func(o *sandbox.Options) {
		o.ReadyVMs, o.BackgroundSnapshots, o.Places = 1, true, a
	})
	run(t, s, sandbox.Request{Argv: []string{"true"}})
	waitFor(t, "the background snapshot", func() bool {
		l, err := s.WarmList(context.Background())
		return err == nil && len(l.Snapshots) == 1
	})
	run(t, s, sandbox.Request{Argv: []string{"true"}}) // the shape is hot now

	owning := []string{"add_entropy", "sync_clock", "set_hostname"}
	bootIDs := map[string]bool{}
	for i := 0; i < 2; i++ {
		waitFor(t, "a ready VM", func() bool { return readyIn(a, d) == 1 })
		m := waitingMachine(t, d)
		id := m.Config().ID
		before := log.of(id)
		if len(before) != 5 || !sameSet(before[:3], owning) || before[3] != "mount" || before[4] != "exec /bin/sh -c true" {
			t.Fatalf("ready VM %d before its claim: %q; want %q (any order), mount, the warm-up", i, before, owning)
		}
		seed := m.State().LastSeed

		rep := run(t, s, sandbox.Request{Argv: []string{"echo", "claimed"}})
		if !rep.ReadyVM || rep.VMID != id || rep.Stdout != "claimed\n" {
			t.Fatalf("claim %d: ready %v vm %s (want %s) stdout %q", i, rep.ReadyVM, rep.VMID, id, rep.Stdout)
		}
		claim := log.of(id)[len(before):]
		want := append(slices.Clone(owning), "configure_net", "set_boot_id")
		if len(claim) != 6 || !sameSet(claim[:5], want) || claim[5] != "exec echo claimed" {
			t.Errorf("claim %d: %q; want %q (any order), then the command alone", i, claim, want)
		}
		st := m.State()
		if st.BootID == "" || bootIDs[st.BootID] {
			t.Errorf("claim %d: boot id %q; want one of its own", i, st.BootID)
		}
		bootIDs[st.BootID] = true
		if len(st.LastSeed) < 64 || bytes.Equal(st.LastSeed, seed) {
			t.Errorf("claim %d: no fresh entropy at the claim", i)
		}
		if st.Hostname != rep.Name || st.Net == nil || rep.GuestIP == "" {
			t.Errorf("claim %d: hostname %q (run %q) net %v ip %q; want the run's", i, st.Hostname, rep.Name, st.Net, rep.GuestIP)
		}
	}
}
