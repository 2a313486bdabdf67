package agent

import "sync"

// spare holds one thing made ahead for the next exec (its cgroup, its
// pipes, its process), so that making it is off the exec's path and, above
// all, a snapshot's clone finds it made.
type spare[T any] struct {
	mu sync.Mutex
	v  *T
}

// take returns the thing held, nil when there is none, and empties the
// holder.
func (s *spare[T]) take() *T {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.v
	s.v = nil
	return v
}

// ready reports whether something is held.
func (s *spare[T]) ready() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.v != nil
}

// put holds v, unless something is held already (two made at once):
// then v is dropped.
func (s *spare[T]) put(v *T, drop func(*T)) {
	s.mu.Lock()
	if s.v == nil {
		s.v = v
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	drop(v)
}
