package supervisor

import "time"

// SetCallReadTimeout sets how long a connection may take to send its
// call, and returns what restores it.
func SetCallReadTimeout(d time.Duration) (restore func()) {
	old := callReadTimeout
	callReadTimeout = d
	return func() { callReadTimeout = old }
}
