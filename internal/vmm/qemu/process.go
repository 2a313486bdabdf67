package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"isopod/internal/jail"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// pipeDrain bounds how long Wait waits for the console and stderr copies
// once QEMU has exited (only a leftover child holding the pipes could make
// it wait at all).
const pipeDrain = 5 * time.Second

// proc is one QEMU process in its own process group.
type proc struct {
	cmd *exec.Cmd
	// pid is QEMU's host pid; pgid is its process group, led by the
	// direct child (QEMU itself, or the program that made its jail).
	pid       int
	pgid      int
	startTime uint64
	started   time.Time
	// toExec is how long a jailed start took from the helper's start to
	// the VMM's exec (0 unjailed).
	toExec time.Duration
	stderr *tailBuffer

	mu     sync.Mutex
	exited bool // the process has exited; its pid may be reaped any moment

	done chan struct{}
	err  error // set before done is closed
}

// procSpec is a QEMU process to start.
type procSpec struct {
	bin  string
	args []string
	// extra become fds 3, 4, ... in QEMU; stdout receives its stdout
	// (nil: /dev/null).
	extra  []*os.File
	stdout io.Writer
	// jail, when set, confines QEMU (see jailSpec for the rest).
	jail *jail.Jailer
	js   jail.Spec
}

// startProc starts a QEMU process in a new process group. It gets SIGKILL
// if the thread that started it dies; that thread stays locked until the
// process exits, so it is the life of isopod.
func startProc(ps procSpec) (*proc, error) {
	p := &proc{
		stderr: &tailBuffer{max: 16 << 10},
		done:   make(chan struct{}),
	}
	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking thread exits, not the process;
		// keep this thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cleanup, err := p.launch(ps)
		if err != nil {
			if cleanup != nil {
				cleanup()
			}
			started <- err
			return
		}
		started <- nil
		p.waitExit()
		// What the jail made (the cgroup) is gone before anyone learns
		// of the exit: a VM started next under the same id makes it anew.
		if cleanup != nil {
			cleanup()
		}
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", ps.bin, err)
	}
	return p, nil
}

// launch starts the process, confined when ps says so, and records its
// pids. cleanup (when not nil) runs once the process has exited.
func (p *proc) launch(ps procSpec) (cleanup func(), err error) {
	var jp *jail.Process
	if ps.jail == nil {
		p.cmd = exec.Command(ps.bin, ps.args...)
		p.cmd.ExtraFiles = ps.extra
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	} else {
		js := ps.js
		js.Path, js.Args, js.ExtraFiles = ps.bin, ps.args, ps.extra
		if jp, err = ps.jail.Command(js); err != nil {
			return nil, err
		}
		p.cmd = jp.Cmd
		cleanup = jp.Cleanup
	}
	p.cmd.Stdin = nil
	p.cmd.Stdout = ps.stdout
	p.cmd.Stderr = p.stderr
	p.cmd.WaitDelay = pipeDrain
	p.started = time.Now()
	if err := p.cmd.Start(); err != nil {
		return cleanup, err
	}
	p.pgid, p.pid = p.cmd.Process.Pid, p.cmd.Process.Pid
	if jp != nil {
		if err := jp.Started(); err != nil {
			syscall.Kill(-p.pgid, syscall.SIGKILL)
			p.cmd.Wait()
			if msg := p.stderr.String(); msg != "" {
				err = fmt.Errorf("%w (%s)", err, msg)
			}
			return cleanup, err
		}
		p.pid = jp.Pid
		p.toExec = time.Since(p.started)
	}
	p.startTime, _ = procStartTime(p.pid)
	return cleanup, nil
}

// waitExit learns of the exit without reaping first, so that kill never
// signals a reused process group, then reaps and records how it ended.
func (p *proc) waitExit() {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, p.pgid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			break
		}
	}
	// Children of QEMU share its group; the unreaped leader keeps the
	// group id from being reused.
	syscall.Kill(-p.pgid, syscall.SIGKILL)
	p.mu.Lock()
	p.exited = true
	p.mu.Unlock()
	p.err = describeExit(p.cmd.Wait(), p.stderr)
}

// kill sends SIGKILL to the process group unless the process has exited.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		syscall.Kill(-p.pgid, syscall.SIGKILL)
	}
}

// wait blocks until the process has exited and its output is copied.
func (p *proc) wait() error {
	<-p.done
	return p.err
}

// describeExit wraps how QEMU ended with the tail of its stderr.
func describeExit(err error, stderr *tailBuffer) error {
	if err == nil {
		return nil
	}
	if msg := stderr.String(); msg != "" {
		return fmt.Errorf("qemu: %w: %s", err, msg)
	}
	return fmt.Errorf("qemu: %w", err)
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// String returns the kept bytes, trimmed.
func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}

// procStartTime returns field 22 of /proc/PID/stat: the start time in clock
// ticks since boot.
func procStartTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("reading process start time: %w", err)
	}
	return parseStatStartTime(b)
}

// parseStatStartTime extracts field 22 from a /proc/PID/stat line. The
// command name (field 2) is in parentheses and may itself contain spaces and
// parentheses, so fields are counted from the last ')'.
func parseStatStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("proc stat: no command name")
	}
	// After ") " comes field 3 (state); field 22 is the 20th from there.
	fields := bytes.Fields(stat[i+1:])
	if len(fields) < 20 {
		return 0, fmt.Errorf("proc stat: %d fields after the name, want at least 20", len(fields))
	}
	v, err := strconv.ParseUint(string(fields[19]), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("proc stat: start time: %w", err)
	}
	return v, nil
}
