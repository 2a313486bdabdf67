package sandbox

import "sync"

// Background teardown. A run's report is complete once its output and
// copy-out are in and its VMM is killed; reaping the VMM, removing the
// scratch disk and finishing the record can happen after the report is
// returned. A front end that opts in with TeardownInBackground must call
// Wait before its process exits, so that nothing is left behind.
//
// The state lives beside the Service (keyed by it) so that it needs no
// field in the Service struct.

type teardownState struct {
	mu         sync.Mutex
	background bool
	wg         sync.WaitGroup
}

var teardowns sync.Map // *Service -> *teardownState

func (s *Service) teardownState() *teardownState {
	v, _ := teardowns.LoadOrStore(s, &teardownState{})
	return v.(*teardownState)
}

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
