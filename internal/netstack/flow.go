package netstack

import (
	"errors"
	"net"
	"net/netip"
	"sync"
	"time"

	"isopod/internal/egress"
)

// flowState is one open TCP connection or UDP flow: what to close to end it.
type flowState struct {
	mu      sync.Mutex
	aborted bool
	closers []func()
}

// onAbort registers c to end the flow; it runs at once if the flow was
// already aborted.
func (f *flowState) onAbort(c func()) {
	f.mu.Lock()
	if !f.aborted {
		f.closers = append(f.closers, c)
		f.mu.Unlock()
		return
	}
	f.mu.Unlock()
	c()
}

// abort ends the flow. Idempotent.
func (f *flowState) abort() {
	f.mu.Lock()
	cs := f.closers
	f.closers, f.aborted = nil, true
	f.mu.Unlock()
	for _, c := range cs {
		c()
	}
}

// track registers f; false when the stack is closing or full.
func (s *Stack) track(f *flowState) (ok bool, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return false, egress.ReasonShuttingDown
	case len(s.flows) >= s.cfg.MaxFlows:
		return false, egress.ReasonFlowLimit
	}
	s.flows[f] = struct{}{}
	s.wg.Add(1) // before Close sets closed, so never concurrent with Wait at zero
	return true, ""
}

// untrack ends what track began; exactly once per successful track.
func (s *Stack) untrack(f *flowState) {
	s.mu.Lock()
	delete(s.flows, f)
	s.mu.Unlock()
	s.wg.Done()
}

// isTimeout reports whether err is a deadline expiring (host sockets and
// gonet conns report it differently).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// quietSet remembers recently refused (proto, destination) pairs so that a
// guest retrying the same refused UDP or ICMP destination many times a
// second yields one record, not thousands. Bounded in size and time.
type quietSet struct {
	mu   sync.Mutex
	seen map[quietKey]time.Time
}

type quietKey struct {
	proto string
	dst   netip.Addr
	port  uint16
}

const (
	quietFor = 10 * time.Second
	quietCap = 256
)

// first reports whether (proto, dst, port) was not refused in the last
// quietFor, and remembers it.
func (q *quietSet) first(proto string, dst netip.Addr, port uint16) bool {
	now := time.Now()
	k := quietKey{proto, dst, port}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.seen == nil {
		q.seen = make(map[quietKey]time.Time)
	}
	if t, ok := q.seen[k]; ok && now.Sub(t) < quietFor {
		return false
	}
	if len(q.seen) >= quietCap {
		for key, t := range q.seen {
			if now.Sub(t) >= quietFor {
				delete(q.seen, key)
			}
		}
		if len(q.seen) >= quietCap {
			clear(q.seen)
		}
	}
	q.seen[k] = now
	return true
}
