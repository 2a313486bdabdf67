package oci

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
)

// Stall is how little a registry request may move before it is given up
// on: one that moves no byte for a whole Window, or fewer than MinRate
// bytes a second over any Window of its life, fails with a *StallError.
// A request's life runs from its start (connecting, sending, waiting for
// the response's headers) to the end of its response body, so a server
// that accepts a connection and never answers stalls too.
type Stall struct {
	Window time.Duration
	// MinRate is in bytes a second; 0: only silence for a whole Window
	// counts.
	MinRate int64
}

// DefaultStall is 60 s and 10 KiB/s. The zero Stall means it.
var DefaultStall = Stall{Window: 60 * time.Second, MinRate: 10 << 10}

func (s Stall) resolved() Stall {
	if s.Window <= 0 {
		return DefaultStall
	}
	return s
}

// StallError is a registry request given up on for moving too little.
// It is errdefs.ErrUnavailable.
type StallError struct {
	Request string // method and URL, without the query
	Moved   int64  // bytes moved over the last window
	Stall   Stall
	// Unanswered: the response's headers had not come (the error then
	// reaches the caller inside a *url.Error, which names the request).
	Unanswered bool
}

func (e *StallError) Error() string {
	var msg string
	switch {
	case e.Unanswered && e.Moved == 0:
		msg = fmt.Sprintf("no answer from the registry in %s", e.Stall.Window)
	case e.Moved == 0:
		msg = fmt.Sprintf("%s: the registry sent nothing for %s", e.Request, e.Stall.Window)
	case e.Unanswered:
		msg = fmt.Sprintf("only %d bytes sent in %s and no answer yet", e.Moved, e.Stall.Window)
	default:
		msg = fmt.Sprintf("%s: only %d bytes moved in %s", e.Request, e.Moved, e.Stall.Window)
	}
	if e.Moved == 0 {
		return msg + fmt.Sprintf(": the registry or the network is stalled; try again later (%s sets how long isopod waits)", knobs.RegistryStallS)
	}
	return msg + fmt.Sprintf(", under the floor of %d KiB/s: the registry or the network is too slow; try again later (%s and %s set the window and the floor)",
		e.Stall.MinRate>>10, knobs.RegistryStallS, knobs.RegistryMinKiBps)
}

func (e *StallError) Unwrap() error { return errdefs.ErrUnavailable }

// watch measures what one request moves, over a sliding window, and
// cancels it with a *StallError when that is too little.
type watch struct {
	stall  Stall
	what   string
	cancel context.CancelCauseFunc
	n      atomic.Int64
	fired  atomic.Pointer[StallError]
	done   chan struct{}
	once   sync.Once
}

// startWatch watches a request under parent; the request must run under
// the returned context, and stop must be called when it ends.
func startWatch(parent context.Context, s Stall, what string) (*watch, context.Context) {
	ctx, cancel := context.WithCancelCause(parent)
	w := &watch{stall: s, what: what, cancel: cancel, done: make(chan struct{})}
	go w.run(ctx)
	return w, ctx
}

func (w *watch) add(n int) {
	if n > 0 {
		w.n.Add(int64(n))
	}
}

// stop ends the watch and releases the request's context.
func (w *watch) stop() {
	w.once.Do(func() {
		close(w.done)
		w.cancel(nil)
	})
}

// err is the stall that ended the request, if one did; unanswered says
// it ended before the response's headers came.
func (w *watch) err(unanswered bool) error {
	e := w.fired.Load()
	if e == nil {
		return nil
	}
	if unanswered {
		c := *e
		c.Unanswered = true
		return &c
	}
	return e
}

type sample struct {
	t time.Time
	n int64
}

// run samples the byte count every eighth of a window and judges the
// last window: from the newest sample at least a window old to now.
func (w *watch) run(ctx context.Context) {
	t := time.NewTicker(max(w.stall.Window/8, 5*time.Millisecond))
	defer t.Stop()
	samples := []sample{{time.Now(), 0}}
	for {
		select {
		case <-w.done:
			return
		case <-ctx.Done():
			return
		case <-t.C:
		}
		now, n := time.Now(), w.n.Load()
		samples = append(samples, sample{now, n})
		base := -1
		for i, s := range samples {
			if now.Sub(s.t) < w.stall.Window {
				break
			}
			base = i
		}
		if base < 0 {
			continue
		}
		samples = samples[base:]
		moved, elapsed := n-samples[0].n, now.Sub(samples[0].t)
		need := int64(1)
		if w.stall.MinRate > 0 {
			need = max(1, int64(float64(w.stall.MinRate)*elapsed.Seconds()))
		}
		if moved < need {
			e := &StallError{Request: w.what, Moved: moved, Stall: w.stall}
			w.fired.Store(e)
			w.cancel(e)
			return
		}
	}
}

// watchedBody counts a body's bytes into its watch; a request body's
// are what is sent, a response body's what arrives.
type watchedBody struct {
	rc       io.ReadCloser
	w        *watch
	response bool // a response body: its end ends the watch
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.w.add(n)
	if err != nil && b.response {
		if serr := b.w.err(false); serr != nil {
			return n, serr
		}
		if err == io.EOF {
			b.w.stop()
		}
	}
	return n, err
}

func (b *watchedBody) Close() error {
	if b.response {
		defer b.w.stop()
	}
	return b.rc.Close()
}

// watchRequest gives r's copy a watch: its context, and bodies that count.
func watchRequest(r *http.Request, s Stall) (*http.Request, *watch) {
	u := *r.URL
	u.RawQuery, u.Fragment, u.User = "", "", nil
	w, ctx := startWatch(r.Context(), s, r.Method+" "+u.String())
	r = r.WithContext(ctx)
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &watchedBody{rc: r.Body, w: w}
	}
	if gb := r.GetBody; gb != nil {
		r.GetBody = func() (io.ReadCloser, error) {
			rc, err := gb()
			if err != nil || rc == http.NoBody {
				return rc, err
			}
			return &watchedBody{rc: rc, w: w}, nil
		}
	}
	return r, w
}
