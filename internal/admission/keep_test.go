package admission_test

import (
	"testing"

	"isopod/internal/admission"
)

// A kept place stays taken past its Release until the last Keep is done:
// the call waiting behind it is admitted only then.
func TestKeepHoldsAReleasedPlace(t *testing.T) {
	a := newAdmission(t, admission.Config{MaxVMs: 1, Queue: 2, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	first, err := a.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	done1, done2 := first.Keep(), first.Keep()
	next, err := a.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	first.Release()
	first.Release()
	if s, _ := state(next); s != admission.TicketQueued || a.Stats().Running != 1 {
		t.Fatalf("after the release of a kept place: next is %d, %+v; want it queued behind the place", s, a.Stats())
	}
	done1()
	done1() // idempotent: the other Keep still holds
	if s, _ := state(next); s != admission.TicketQueued {
		t.Fatalf("one of two Keeps done: next is %d; want queued", s)
	}
	done2()
	if s, _ := state(first); s != admission.TicketReleased {
		t.Errorf("every Keep done: first is %d; want released", s)
	}
	if s, _ := state(next); s != admission.TicketAdmitted {
		t.Errorf("every Keep done: next is %d; want admitted", s)
	}
	next.Release()
	if st := a.Stats(); st.Running != 0 || st.UsedMiB != 0 {
		t.Errorf("all released: %+v", st)
	}
}

// A Keep done before the Release leaves the Release to give the place
// back at once; a nil Ticket keeps nothing.
func TestKeepDoneFirst(t *testing.T) {
	a := newAdmission(t, admission.Config{MaxVMs: 1, Queue: 1, MemoryBudgetMiB: 100000, OverheadMiB: 256, MinMemMiB: 128, RunMemMiB: 512})
	tk, err := a.Reserve(512)
	if err != nil {
		t.Fatal(err)
	}
	tk.Keep()()
	tk.Release()
	if st := a.Stats(); st.Running != 0 {
		t.Errorf("released after its Keep was done: %+v; want the place free", st)
	}
	var none *admission.Ticket
	none.Keep()()
}
