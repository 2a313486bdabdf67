package admission

import "sync"

// A call's place and its VM's last moments. A run's report is complete
// once its VMM is killed; the process is reaped, and its memory handed
// back to the host, after that, often after the front end has released
// the call's place. Keep makes such a release wait for the reap, so that
// a place given back is a place free: no more VMMs live than there are
// places, even for a moment.

// Keep holds t's place past its Release until the returned function has
// been called (once per Keep): a run takes it before its VM starts and
// calls it when its VMM is gone. A Release that comes first is done then.
// A nil Ticket keeps nothing; the function is idempotent.
func (t *Ticket) Keep() (done func()) {
	if t == nil {
		return func() {}
	}
	a := t.a
	a.mu.Lock()
	t.keeps++
	a.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			a.lock() // without the ledger, the place is still given back here
			t.keeps--
			if t.keeps > 0 || !t.releaseDue {
				a.unlock()
				return
			}
			t.releaseDue = false
			a.unlockEnding(t.releaseLocked())
		})
	}
}

// deferRelease reports whether t's release waits for a Keep, noting that
// it is due.
//
// Preconditions: a.mu is held.
func (t *Ticket) deferRelease() bool {
	if t.keeps == 0 || t.state != TicketAdmitted {
		return false
	}
	t.releaseDue = true
	return true
}
