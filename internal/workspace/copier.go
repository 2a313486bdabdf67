package workspace

import (
	"sync"
)

// copyWorkers is how many files' data a Pack copies at once. The walk
// itself (listing, stat, counting against the caps) stays sequential; the
// data copies, most of the time of a copy onto tmpfs, overlap.
const copyWorkers = 4

// copier runs the data copies of the staged files on a few goroutines and
// keeps the first error any of them had.
type copier struct {
	sem chan struct{}

	mu     sync.Mutex // guards following
	err    error
	shrunk int64 // bytes fewer than stat said, of files that shrank meanwhile
}

func newCopier(n int) *copier { return &copier{sem: make(chan struct{}, n)} }

// dirJobs are the copies in flight of one staged directory: the directory's
// mode and time are set, and its descriptor closed, only once they are done.
type dirJobs struct {
	c  *copier
	wg sync.WaitGroup
}

// dir starts the job set of a directory; a nil copier runs each job at once.
func (c *copier) dir() *dirJobs { return &dirJobs{c: c} }

// run runs job, which returns how many bytes fewer than stat said it
// copied: at once without a copier, returning what job did; else on a
// goroutine of the copier's, returning 0 and nil (see wait).
func (d *dirJobs) run(job func() (int64, error)) (int64, error) {
	if d.c == nil {
		return job()
	}
	d.c.sem <- struct{}{}
	d.wg.Add(1)
	go func() {
		defer func() {
			<-d.c.sem
			d.wg.Done()
		}()
		shrunk, err := job()
		d.c.mu.Lock()
		d.c.shrunk += shrunk
		if err != nil && d.c.err == nil {
			d.c.err = err
		}
		d.c.mu.Unlock()
	}()
	return 0, nil
}

// wait waits for the directory's copies and returns the first error of any
// copy so far.
func (d *dirJobs) wait() error {
	if d.c == nil {
		return nil
	}
	d.wg.Wait()
	d.c.mu.Lock()
	defer d.c.mu.Unlock()
	return d.c.err
}

// shrunkBy is how many bytes fewer than stat said the finished copies
// wrote.
func (c *copier) shrunkBy() int64 {
	if c == nil {
		return 0
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.shrunk
}
