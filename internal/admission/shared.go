package admission

// Places shared between processes. With a ledger (Config.Ledger), every
// change to what an Admission holds is made inside one ledger
// transaction: the other live processes' entries are read under the
// ledger's lock, the decision counts what they hold (a.others) against the
// limits, and this process's entry (its admitted places and how many of
// its calls wait) is written before the lock is released. A call that
// waits only because other processes hold the places is not woken by
// their releases: its Wait looks again after a short backoff. Background
// VMs give way to other processes' waiting calls too: while this process
// holds any, a watcher looks at the ledger and asks the newest to end when
// another process has calls waiting.

import (
	"fmt"
	"time"

	"isopod/internal/ledger"
)

// othersPoll is the longest a waiting call, or a background VM waiting
// for a place, goes without looking at the ledger again.
const othersPoll = 500 * time.Millisecond

// lock takes a.mu and, with a ledger, begins a transaction on it, noting
// what the other processes hold. On a ledger error, a.mu is held all the
// same and a.others is what was last seen: the caller decides, and must
// call unlock either way.
func (a *Admission) lock() error {
	a.mu.Lock()
	if a.cfg.Ledger == nil {
		return nil
	}
	tx, err := a.cfg.Ledger.Begin()
	if err != nil {
		return fmt.Errorf("admission: %w", err)
	}
	a.tx = tx
	a.others = ledger.Sum(tx.Others)
	return nil
}

// unlock writes what this process holds to the ledger, if a transaction
// is under way, and releases a.mu. A failed write leaves the entry as it
// was; the next transaction writes it again.
func (a *Admission) unlock() {
	if a.tx != nil {
		a.tx.Commit(a.itemsLocked(), len(a.queue))
		a.tx = nil
	}
	a.mu.Unlock()
}

// itemsLocked is what this process holds, for its ledger entry.
//
// Preconditions: a.mu is held.
func (a *Admission) itemsLocked() []ledger.Item {
	items := make([]ledger.Item, 0, len(a.places))
	for _, t := range a.places {
		items = append(items, ledger.Item{Kind: t.kind, CostMiB: t.cost, ID: t.id})
	}
	return items
}

// heldTextLocked says what holds the places, for a busy error.
//
// Preconditions: a.mu is held.
func (a *Admission) heldTextLocked() string {
	if a.cfg.Ledger == nil {
		return fmt.Sprintf("%d VMs hold this host's places (limit %d, %d of %d MiB)",
			a.running, a.cfg.MaxVMs, a.usedMiB, a.cfg.MemoryBudgetMiB)
	}
	return fmt.Sprintf("%d VMs hold this host's places, %d of them in other isopod processes (limit %d, %d of %d MiB)",
		a.running+a.others.Places, a.others.Places, a.cfg.MaxVMs, a.usedMiB+a.others.CostMiB, a.cfg.MemoryBudgetMiB)
}

// HeldText says what holds the host's places now, as last seen: for a
// call that gave up waiting.
func (a *Admission) HeldText() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.heldTextLocked()
}

// giveUp releases t, still waiting after bound, when other processes
// hold places, and says so; nil: t waits on.
func (t *Ticket) giveUp(bound time.Duration) error {
	a := t.a
	a.lock()
	if t.state != TicketQueued || a.others.Places == 0 {
		a.unlock() // admitted meanwhile (Wait sees it), or waiting on this process's own VMs
		return nil
	}
	text := a.heldTextLocked()
	a.unlockEnding(t.releaseLocked())
	return fmt.Errorf("no VM place within %s: %s: %w", bound, text, ErrBusy)
}

// retry looks at the ledger again and admits what now fits.
func (a *Admission) retry() {
	if err := a.lock(); err != nil {
		a.unlock()
		return
	}
	a.unlockEnding(a.advanceLocked())
}

// backoff paces a waiting call's looks at the ledger: 50 ms, doubling up
// to othersPoll. Without a ledger it never fires.
type backoff struct {
	d time.Duration
	t *time.Timer
}

func newBackoff(on bool) *backoff {
	if !on {
		return &backoff{}
	}
	return &backoff{d: 50 * time.Millisecond}
}

// c returns the channel of the next look (nil: never).
func (b *backoff) c() <-chan time.Time {
	if b.d == 0 {
		return nil
	}
	b.stop()
	b.t = time.NewTimer(b.d)
	b.d = min(2*b.d, othersPoll)
	return b.t.C
}

func (b *backoff) stop() {
	if b.t != nil {
		b.t.Stop()
	}
}

// watchLocked starts the watcher of other processes' waiting calls, with
// a ledger and background VMs held.
//
// Preconditions: a.mu is held.
func (a *Admission) watchLocked() {
	if a.cfg.Ledger == nil || a.watching || len(a.held) == 0 {
		return
	}
	a.watching = true
	go a.watchOthers()
}

// watchOthers asks this process's newest background VM to end while
// other processes have calls waiting and none of this one's is ending
// already; it returns once no background VM is held.
func (a *Admission) watchOthers() {
	for {
		time.Sleep(othersPoll)
		err := a.lock()
		if len(a.held) == 0 {
			a.watching = false
			a.unlock()
			return
		}
		var ends []func()
		if err == nil && a.others.Waiting > 0 && len(a.queue) == 0 && a.endingVMs == 0 {
			for i := len(a.held) - 1; i >= 0; i-- {
				if v := a.held[i]; !v.ending {
					ends = append(ends, a.endLocked(v))
					break
				}
			}
		}
		a.unlockEnding(ends)
	}
}
