package sandbox

import "sync"

// Background teardown. A run's report is complete once its output and
// copy-out are in and its VMM is killed; reaping the VMM, removing the
// scratch disk and finishing the record can happen after the report is
// returned. A front end that opts in with TeardownInBackground must call
// Wait before its process exits, so that nothing is left behind.

// teardownState is the Service's background teardown bookkeeping.
type teardownState struct {
	mu         sync.Mutex // guards following
	background bool

	wg sync.WaitGroup
}

func (s *Service) teardownState() *teardownState { return &s.td }

// TeardownInBackground makes every later Run return its report before the
// VM's final cleanup, which then finishes in the background. The caller
// must call Wait before exiting.
func (s *Service) TeardownInBackground() {
	t := s.teardownState()
	t.mu.Lock()
	t.background = true
	t.mu.Unlock()
}

// Wait blocks until every background teardown has finished.
func (s *Service) Wait() {
	s.teardownState().wg.Wait()
}

// teardown runs fn now, or in the background when the Service was told to.
func (s *Service) teardown(fn func()) {
	t := s.teardownState()
	t.mu.Lock()
	bg := t.background
	if bg {
		t.wg.Add(1)
	}
	t.mu.Unlock()
	if !bg {
		fn()
		return
	}
	go func() {
		defer t.wg.Done()
		fn()
	}()
}
