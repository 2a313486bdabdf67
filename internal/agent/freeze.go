package agent

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A session's commit copies the scratch disk while the VM runs: the host
// freezes the scratch filesystem (KindFreeze), copies the disk image and
// thaws it (KindThaw). The freeze is bounded, so that a host that fails
// or goes away never leaves the guest's writes blocked: the agent thaws on
// its own when the bound passes or the connection that froze it ends.

// freezer is the one freeze of the scratch filesystem a Server holds.
type freezer struct {
	mu    sync.Mutex
	owner *conn       // the connection holding the freeze; nil: none
	timer *time.Timer // thaws at the bound
	gen   uint64      // counts freezes, so that a stale timer does nothing
	ended string      // why the last freeze ended without its thaw
}

// freezeBound is m's bound on a freeze.
func freezeBound(m *agentproto.Msg) (time.Duration, error) {
	ms := m.FreezeMS
	switch {
	case ms < 0 || ms > agentproto.MaxFreezeMS:
		return 0, fmt.Errorf("freeze_ms %d: must be 0 to %d: %w", ms, agentproto.MaxFreezeMS, errdefs.ErrInvalidArgument)
	case ms == 0:
		ms = agentproto.DefaultFreezeMS
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// freeze freezes the scratch filesystem for c, at most bound long.
func (f *freezer) freeze(c *conn, sys System, bound time.Duration) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owner != nil {
		return fmt.Errorf("the scratch filesystem is already frozen for another commit; retry when it ends: %w", errdefs.ErrFailedPrecondition)
	}
	// Serve cancels the context before it releases: a freeze that comes
	// after the release sees it and never starts.
	if err := c.ctx.Err(); err != nil {
		return fmt.Errorf("the connection ended: %w", err)
	}
	if err := sys.FreezeScratch(); err != nil {
		return err
	}
	f.gen++
	gen := f.gen
	f.owner, f.ended = c, ""
	f.timer = time.AfterFunc(bound, func() {
		f.end(c.log, sys, gen, fmt.Sprintf("no thaw came within %s", bound))
	})
	return nil
}

// end thaws freeze gen, if it still holds, because of why.
func (f *freezer) end(log *slog.Logger, sys System, gen uint64, why string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owner == nil || f.gen != gen {
		return
	}
	f.owner, f.ended = nil, why
	f.timer.Stop()
	if err := sys.ThawScratch(); err != nil {
		log.Error("thawing the scratch filesystem", "why", why, "err", err)
		return
	}
	log.Warn("scratch filesystem thawed without a thaw request", "why", why)
}

// thaw ends c's freeze. It fails when c holds none: the freeze ended on
// its own, so whatever was copied meanwhile may be torn.
func (f *freezer) thaw(c *conn, sys System) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.owner != c {
		why := "it was never frozen"
		if f.ended != "" {
			why = "the freeze ended before the thaw: " + f.ended
		}
		return fmt.Errorf("nothing to thaw (%s); a copy made meanwhile may be torn: %w", why, errdefs.ErrUnavailable)
	}
	f.owner = nil
	f.timer.Stop()
	return sys.ThawScratch()
}

// release thaws the freeze c holds, when its connection ends.
func (f *freezer) release(c *conn) {
	f.mu.Lock()
	owned, gen := f.owner == c, f.gen
	f.mu.Unlock()
	if owned {
		f.end(c.log, c.srv.opts.System, gen, "the connection that froze it ended")
	}
}

// startFreezeCall handles a freeze or thaw in order: a thaw waits for the
// connection's freeze requests before it, so that a host that gave up
// waiting for a freeze's answer and thaws at once does not leave that
// freeze to take hold after its thaw.
func (c *conn) startFreezeCall(m *agentproto.Msg) {
	c.mu.Lock()
	defer c.mu.Unlock()
	prev := c.freezing
	if m.Kind == agentproto.KindThaw {
		c.spawnLocked(func() {
			if prev != nil {
				<-prev
			}
			c.thawScratch(m)
		})
		return
	}
	done := make(chan struct{})
	c.freezing = done
	if !c.spawnLocked(func() {
		defer close(done)
		c.freezeScratch(m)
	}) {
		close(done)
	}
}

func (c *conn) freezeScratch(m *agentproto.Msg) {
	bound, err := freezeBound(m)
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("freeze: %w", err))
		return
	}
	sys, err := c.system()
	if err == nil {
		err = c.srv.freeze.freeze(c, sys, bound)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("freeze: %w", err))
		return
	}
	c.replyOK(m.ID)
}

func (c *conn) thawScratch(m *agentproto.Msg) {
	sys, err := c.system()
	if err == nil {
		err = c.srv.freeze.thaw(c, sys)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("thaw: %w", err))
		return
	}
	c.replyOK(m.ID)
}
