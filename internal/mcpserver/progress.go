package mcpserver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/admission"
)

// runStatus is what a sandbox_run's progress notifications say: queued
// (with the call's place in line), pulling a stage, or running.
type runStatus struct {
	start time.Time
	tool  string // the call's, which the notifications name

	mu     sync.Mutex // guards following
	ticket *admission.Ticket
	phase  string        // "" while running
	poke   chan struct{} // closed and replaced when phase changes
}

func newRunStatus() *runStatus { return newToolStatus(ToolSandboxRun) }

// newToolStatus is a running status of another tool's call.
func newToolStatus(tool string) *runStatus {
	return &runStatus{start: time.Now(), tool: tool, poke: make(chan struct{})}
}

// setTicket makes the status follow t's place in the queue.
func (st *runStatus) setTicket(t *admission.Ticket) {
	st.mu.Lock()
	st.ticket = t
	st.mu.Unlock()
	st.setPhase(st.currentPhase())
}

func (st *runStatus) currentPhase() string {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.phase
}

// setPhase says what the call does now ("" once it runs).
func (st *runStatus) setPhase(p string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.phase = p
	close(st.poke)
	st.poke = make(chan struct{})
}

// message is the notification to send now, and a channel closed when it
// changes before the next tick.
func (st *runStatus) message() (string, <-chan struct{}, <-chan struct{}) {
	st.mu.Lock()
	t, phase, poke := st.ticket, st.phase, st.poke
	st.mu.Unlock()
	secs := int(time.Since(st.start).Seconds())
	var changed <-chan struct{}
	if t != nil {
		state, pos, ch := t.Status()
		changed = ch
		if state == admission.TicketQueued {
			return fmt.Sprintf("%s queued: number %d in line for a VM on this host (%ds)", st.tool, pos, secs), changed, poke
		}
	}
	if phase != "" {
		return fmt.Sprintf("%s: %s (%ds)", st.tool, shortText(phase), secs), changed, poke
	}
	return fmt.Sprintf("%s in progress (%ds)", st.tool, secs), changed, poke
}

// keepalive sends a progress notification at once, then every
// ProgressInterval and whenever the status changes, until the returned
// stop is called, when the client sent a progress token. Send errors are
// ignored: it is a keepalive only.
func (s *Server) keepalive(ctx context.Context, req *mcp.CallToolRequest, st *runStatus) (stop func()) {
	if req == nil || req.Params == nil || req.Session == nil {
		return func() {}
	}
	token := req.Params.GetProgressToken()
	if token == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(s.cfg.ProgressInterval)
		defer t.Stop()
		for n := 1; ; n++ {
			msg, changed, poke := st.message()
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token, Progress: float64(n), Message: msg,
			})
			if err != nil && ctx.Err() == nil {
				s.log.Debug("progress notification failed", "err", err)
			}
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			case <-changed:
			case <-poke:
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}
