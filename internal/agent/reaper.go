package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// reaper starts a child and reports its wait status exactly once.
type reaper interface {
	// start runs fork (which returns the new pid) and returns a channel
	// that receives the child's status when it ends.
	start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error)
}

// pidReaper waits for each child by its pid: the plain-process mode, where
// the agent is not the reaper of orphans.
type pidReaper struct{}

func (pidReaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	go func() {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				// Not our child any more; report a kill so the exec ends.
				ws = unix.WaitStatus(unix.SIGKILL)
			}
			break
		}
		ch <- ws
	}()
	return pid, ch, nil
}

// allReaper is PID 1's reaper: the only caller of wait4 in the process. It
// reaps every child on SIGCHLD, hands the statuses of registered pids to
// their exec and drops the rest (orphans re-parented to PID 1). start forks
// and registers under the same lock the reaper takes before looking a pid
// up, so a child that dies at once is never mistaken for an orphan.
type allReaper struct {
	mu      sync.Mutex
	waiting map[int]chan unix.WaitStatus
}

var (
	theReaper     *allReaper
	theReaperOnce sync.Once
)

// globalReaper starts the process-wide reaper on first use.
func globalReaper() *allReaper {
	theReaperOnce.Do(func() {
		r := &allReaper{waiting: make(map[int]chan unix.WaitStatus)}
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, unix.SIGCHLD)
		go r.loop(sig)
		theReaper = r
	})
	return theReaper
}

func (r *allReaper) start(fork func() (int, error)) (int, <-chan unix.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid, err := fork()
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan unix.WaitStatus, 1)
	r.waiting[pid] = ch
	return pid, ch, nil
}

func (r *allReaper) loop(sig <-chan os.Signal) {
	for {
		r.reapAll()
		<-sig
	}
}

// reapAll collects every child that has ended.
func (r *allReaper) reapAll() {
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return // ECHILD: no children; 0: none has ended yet
		}
		r.mu.Lock()
		ch, ok := r.waiting[pid]
		delete(r.waiting, pid)
		r.mu.Unlock()
		if ok {
			ch <- ws
		}
	}
}
