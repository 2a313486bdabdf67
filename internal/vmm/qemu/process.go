package qemu

import (
	"bytes"
	"errors"
	"fmt"
	"io"
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
	cmd       *exec.Cmd
	pid       int
	startTime uint64
	started   time.Time
	stderr    *tailBuffer

	mu     sync.Mutex
	exited bool // the process has exited; its pid may be reaped any moment

	done chan struct{}
	err  error // set before done is closed
}

// startProc starts bin with args. extra become fds 3, 4, ... in the child;
// stdout receives the child's stdout (nil: /dev/null). The child is in a new
// process group and gets SIGKILL if the thread that started it dies; that
// thread stays locked until the child exits, so it is the life of isopod.
func startProc(bin string, args []string, extra []*os.File, stdout io.Writer) (*proc, error) {
	p := &proc{
		stderr: &tailBuffer{max: 16 << 10},
		done:   make(chan struct{}),
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdin = nil
	cmd.Stdout = stdout
	cmd.Stderr = p.stderr
	cmd.ExtraFiles = extra
	cmd.WaitDelay = pipeDrain
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	p.cmd = cmd

	started := make(chan error, 1)
	go func() {
		// Pdeathsig fires when the forking thread exits, not the process;
		// keep this thread until the child is gone.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		p.started = time.Now()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		p.pid = cmd.Process.Pid
		p.startTime, _ = procStartTime(p.pid)
		started <- nil
		// Learn of the exit without reaping, so that kill never signals a
		// reused process group.
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
			if err != unix.EINTR {
				break
			}
		}
		// Children of QEMU (an exec: migration source) share its group;
		// the unreaped leader keeps the group id from being reused.
		syscall.Kill(-p.pid, syscall.SIGKILL)
		p.mu.Lock()
		p.exited = true
		p.mu.Unlock()
		p.err = describeExit(cmd.Wait(), p.stderr)
		close(p.done)
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	return p, nil
}

// kill sends SIGKILL to the process group unless the process has exited.
func (p *proc) kill() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.exited {
		syscall.Kill(-p.pid, syscall.SIGKILL)
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
