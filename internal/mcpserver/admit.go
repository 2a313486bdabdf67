package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"isopod/internal/admission"
	"isopod/internal/sandbox"
)

// Admission: every sandbox_run takes a place from the server's
// [admission.Admission] before its VM starts, waits in its queue when the
// host is full, and is refused at once as busy when the queue is full
// too. Over HTTP the place is taken by the gate (gate.go) before the SDK
// sees the call, so that a busy host answers 503; the handler then finds
// the ticket in its context. On stdio the handler takes it itself.

// httpCall is what the HTTP gate knows of one call: its lifetime (which
// ends when a notifications/cancelled names the call, when the server
// stops, or under the 2026-07-28 protocol when its POST ends), the place
// it reserved, and the stream its answer is recorded on.
type httpCall struct {
	ctx    context.Context
	ticket *admission.Ticket
	stream *callStream
}

type httpCallKey struct{}

// httpCallFrom returns the gate's record of the call ctx belongs to: the
// SDK's stateless sessions keep the HTTP request's context values in
// their handlers' contexts.
func httpCallFrom(ctx context.Context) *httpCall {
	c, _ := ctx.Value(httpCallKey{}).(*httpCall)
	return c
}

// reserve takes the call's place: the one the gate reserved, or a new one.
// nil without an Admission.
func (s *Server) reserve(ctx context.Context, memMiB int) (*admission.Ticket, error) {
	if c := httpCallFrom(ctx); c != nil && c.ticket != nil {
		return c.ticket, nil
	}
	if s.cfg.Admission == nil {
		return nil, nil
	}
	return s.cfg.Admission.Reserve(runMemMiB(memMiB))
}

// runMemMiB is the guest memory a run asks for, its default applied (by
// the core's rule: the request is checked later).
func runMemMiB(m int) int {
	return sandbox.Request{MemMiB: max(m, 0)}.WithDefaults().MemMiB
}

// busyText words a refused place for a tool error.
func busyText(err error) string {
	msg := plain(err)
	if errors.Is(err, admission.ErrBusy) {
		return fmt.Sprintf("%s busy (unavailable): %s. Fix: this host is full; retry in a few seconds or send the call to another host.", ToolSandboxRun, msg)
	}
	return fmt.Sprintf("%s failed (unavailable): %s. Fix: ask for less mem_mib, or send the call to a host with a larger budget.", ToolSandboxRun, msg)
}

// waitAdmitted waits for t (nil: no admission) while the status says the
// call is queued. A call still waiting after bound (its timeout_s) while
// other isopod processes hold places (CLI runs, sessions) is refused as
// busy.
func waitAdmitted(ctx context.Context, t *admission.Ticket, st *runStatus, bound time.Duration) error {
	if t == nil {
		return nil
	}
	st.setTicket(t)
	if err := t.WaitBounded(ctx, bound); err != nil {
		return fmt.Errorf("waiting for a VM place: %w", err)
	}
	return nil
}

// latePlaces is the server's admission as the core's background VMs see
// it (sandbox.Options.Places): the core is made before the admission,
// whose defaults ask the core for the accelerator, so it is set once
// known. Until then no background VM has a place.
type latePlaces struct {
	mu    sync.Mutex // guards following
	a     *admission.Admission
	ready chan struct{} // closed by set
}

var _ sandbox.Places = (*latePlaces)(nil)

func newLatePlaces() *latePlaces { return &latePlaces{ready: make(chan struct{})} }

// set makes a the admission, once.
func (l *latePlaces) set(a *admission.Admission) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.a == nil && a != nil {
		l.a = a
		close(l.ready)
	}
}

func (l *latePlaces) get() *admission.Admission {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.a
}

// TryHold is the admission's, or no place before it is set.
func (l *latePlaces) TryHold(memMiB int, y admission.Yield) (*admission.Ticket, bool) {
	if a := l.get(); a != nil {
		return a.TryHold(memMiB, y)
	}
	return nil, false
}

// CanHold is the admission's, or true before it is set.
func (l *latePlaces) CanHold(memMiB int) bool {
	if a := l.get(); a != nil {
		return a.CanHold(memMiB)
	}
	return true
}

// Freed is the admission's, or closed when it is set.
func (l *latePlaces) Freed() <-chan struct{} {
	if a := l.get(); a != nil {
		return a.Freed()
	}
	return l.ready
}
