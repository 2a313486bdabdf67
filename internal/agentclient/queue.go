package agentclient

import (
	"context"
	"sync"
)

// queue is an unbounded FIFO of frames, so that the reader never blocks on a
// slow consumer of one request while others wait.
type queue struct {
	mu     sync.Mutex // guards following
	items  []frame
	closed bool

	signal chan struct{}
}

func newQueue() *queue { return &queue{signal: make(chan struct{}, 1)} }

func (q *queue) push(f frame) {
	q.mu.Lock()
	q.items = append(q.items, f)
	q.mu.Unlock()
	q.wake()
}

func (q *queue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wake()
}

func (q *queue) wake() {
	select {
	case q.signal <- struct{}{}:
	default:
	}
}

// pop returns the next frame; ok is false once the queue is closed and empty.
func (q *queue) pop(ctx context.Context) (f frame, ok bool, err error) {
	for {
		q.mu.Lock()
		if len(q.items) > 0 {
			f = q.items[0]
			q.items[0] = frame{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return f, true, nil
		}
		closed := q.closed
		q.mu.Unlock()
		if closed {
			return frame{}, false, nil
		}
		select {
		case <-q.signal:
		case <-ctx.Done():
			return frame{}, false, ctx.Err()
		}
	}
}
