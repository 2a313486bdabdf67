package agent

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// A process started ahead for the next exec (an exec stub). Starting a
// command takes a fork: the kernel's process creation, a kernel stack, the
// cgroup's task set and the child's set-up. A clone of a snapshot under
// TCG translates all of that afresh for its first command, about a tenth
// of the guest code a warm `true` translates. So before a snapshot
// (KindSettle) the process itself is made ahead: the agent's own binary
// in its stub mode (ExecStubArg), started in the spare cgroup, in a
// process group of its own, with the spare pipes as its standard streams.
// It waits for one request on descriptor 3: the program, the directory,
// the arguments and the environment. Then it changes directory and
// executes the program, which keeps its pid, group and cgroup. On
// descriptor 4, closed on a successful exec, it says it is ready, that it
// took the request, and the errno of a failure before it exits.
//
// An exec with stdin or a request the stub cannot carry forks as before,
// and so does one when no stub is ready or the stub cannot take it (a
// command may kill or stop every process of the guest).

// ExecStubArg is the argument that makes the agent binary an exec stub.
const ExecStubArg = "--exec-stub"

// readyStub makes the next exec's process, a stub, when the Server has a
// stub program and none is ready, before a snapshot (KindSettle): only a
// snapshot's clone gains by it, as its QEMU translates a fork afresh. A
// running VM's QEMU has translated the fork already, so a stub made after
// each exec would only compete with the next command for the guest's CPU.
// The spare cgroup and pipes the stub takes are made again.
func (s *Server) readyStub(reap reaper) {
	s.stub.refill(s, reap)
	s.refillSpares()
}

// startProcess starts prog for req: through the stub made ahead when one
// is ready and the request has no stdin, else by a fork of its own. It
// returns the pipes and cgroup in use, also when the start failed.
func (c *conn) startProcess(req *agentproto.Exec, prog, cwd string, env []string) (int, <-chan unix.WaitStatus, *execPipes, *execCgroup, error) {
	if !req.Stdin && c.srv.stub.ready() {
		if b, ok := encodeStubRequest(prog, cwd, req.Argv, env); ok {
			if s := c.srv.stub.take(); s != nil {
				err := s.exec(b)
				if !errors.Is(err, errStubGone) {
					return s.pid, s.wait, s.pipes, s.cg, err
				}
				c.log.Debug("the exec stub could not take the command; forking", "err", err)
			}
		}
	}
	p, err := c.srv.pipes.take(req.Stdin)
	if err != nil {
		return 0, nil, nil, nil, err
	}
	cg := c.srv.opts.Cgroups.forExec(c.srv.cgroupSeq.Add(1))
	pid, wait, err := c.forkExec(prog, req.Argv, cwd, env, p, cg)
	return pid, wait, p, cg, err
}

// stubProc is a started stub.
type stubProc struct {
	pid    int
	wait   <-chan unix.WaitStatus
	cg     *execCgroup // nil when commands are not confined
	pipes  *execPipes
	ctl    int // write end of the request pipe
	status int // read end of the status pipe
	pidfd  int
	reaped bool // wait has delivered
}

// maxStubRequest bounds a request a stub is sent: the pipe holds it
// whole, so the write never waits for the stub. Larger ones fork.
const maxStubRequest = 60 << 10

// stubReady bounds how long a new stub may take to be ready, and
// stubStart how long a stub may take to execute a request before it is
// killed and the exec forks instead (a stub stopped by a command). Tests
// shorten stubStart.
const stubReady = 30 * time.Second

var stubStart = 10 * time.Second

// spareStub holds the stub made ahead.
type spareStub struct{ spare[stubProc] }

// take returns the spare stub when it is still alive, else nil (a dead
// one is cleaned up).
func (ss *spareStub) take() *stubProc {
	s := ss.spare.take()
	if s == nil {
		return nil
	}
	select {
	case <-s.wait:
		s.reaped = true
		s.kill()
		return nil
	default:
		return s
	}
}

// refill starts a stub when there is none and the Server has a stub
// program, in a cgroup of its own when commands are confined, and waits
// until it is ready for a request.
func (ss *spareStub) refill(srv *Server, reap reaper) {
	bin := srv.opts.ExecStub
	if bin == "" || ss.ready() {
		return
	}
	g := srv.opts.Cgroups
	cg := g.forExec(srv.cgroupSeq.Add(1))
	if cg == nil && g.confined() {
		return // no command runs unconfined; the next exec says why
	}
	p, err := srv.pipes.take(false)
	if err != nil {
		cg.remove()
		return
	}
	s, err := startStub(bin, cg, p, reap)
	if err != nil {
		srv.log.Debug("starting an exec stub failed", "err", err)
		p.closeAll()
		cg.remove()
		return
	}
	ss.put(s, (*stubProc).kill) // two started at once: one is kept
}

// stubArgv is a stub's command line: the name that commands listing the
// guest's processes see, and ExecStubArg.
var stubArgv = []string{"isopod-exec-stub", ExecStubArg}

// startStub starts bin as a stub, in cg when not nil, with p's child ends
// as its standard streams, and waits for it to say it is ready. On
// failure p's child ends are closed and cg and p's other ends are the
// caller's.
func startStub(bin string, cg *execCgroup, p *execPipes, reap reaper) (*stubProc, error) {
	var ctl, status [2]int
	if err := unix.Pipe2(ctl[:], unix.O_CLOEXEC); err != nil {
		p.closeChildEnds()
		return nil, fmt.Errorf("stub request pipe: %w", err)
	}
	if err := unix.Pipe2(status[:], unix.O_CLOEXEC); err != nil {
		p.closeChildEnds()
		unix.Close(ctl[0])
		unix.Close(ctl[1])
		return nil, fmt.Errorf("stub status pipe: %w", err)
	}
	pidfd := -1
	sys := &syscall.SysProcAttr{Setpgid: true, PidFD: &pidfd}
	if cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, cg.fd
	}
	attr := &syscall.ProcAttr{
		Dir: "/",
		// As the agent's: no preemption signals while it waits or execs.
		Env: []string{"GODEBUG=asyncpreemptoff=1"},
		Files: []uintptr{p.childIn.Fd(), p.childOut.Fd(), p.childErr.Fd(),
			uintptr(ctl[0]), uintptr(status[1])},
		Sys: sys,
	}
	pid, wait, err := reap.start(func() (int, error) {
		return syscall.ForkExec(bin, stubArgv, attr)
	})
	unix.Close(ctl[0])
	unix.Close(status[1])
	p.closeChildEnds()
	if err != nil {
		unix.Close(ctl[1])
		unix.Close(status[0])
		return nil, err
	}
	s := &stubProc{pid: pid, wait: wait, cg: cg, pipes: p, ctl: ctl[1], status: status[0], pidfd: pidfd}
	var b [1]byte
	if n, err := readTimeout(s.status, b[:], stubReady); n != 1 || b[0] != stubReadyByte {
		if !s.reaped {
			unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
		}
		s.reap()
		s.closeFDs()
		return nil, fmt.Errorf("the exec stub did not get ready: %v", err)
	}
	return s, nil
}

// What a stub writes on its status pipe once ready, and once it has read
// a request.
const (
	stubReadyByte = 'r'
	stubTookByte  = 't'
)

// exec has the stub run req (encodeStubRequest's). It returns nil once
// the program runs, or the errno of why it could not (the stub is then
// gone, and its cgroup and pipes are the caller's). A stub that could not
// take the request (dead before, stopped or too slow) is ended with its
// cgroup and pipes, and errStubGone returned.
func (s *stubProc) exec(req []byte) error {
	_, werr := unix.Write(s.ctl, req)
	unix.Close(s.ctl) // the request ends at EOF
	s.ctl = -1
	// The status: stubTookByte once the stub has the request, then EOF
	// when the program runs or the errno of why it cannot.
	var b [5]byte
	n, rerr := readTimeout(s.status, b[:], stubStart)
	switch {
	case n == 5 && b[0] == stubTookByte:
		s.reap()
		s.closeFDs()
		return syscall.Errno(binary.NativeEndian.Uint32(b[1:]))
	case n == 1 && b[0] == stubTookByte && rerr == nil:
		s.closeFDs()
		return nil
	}
	// It did not take the request, or took it but did not get to the
	// exec in time: the program has not started.
	s.kill()
	if err := errors.Join(werr, rerr); err != nil {
		return fmt.Errorf("%w: %w", errStubGone, err)
	}
	return fmt.Errorf("%w: a short status", errStubGone)
}

var errStubGone = errors.New("the exec stub is gone")

// kill ends a stub that will not be used, with its cgroup and pipes. The
// signal goes through the pidfd, which never names another process.
func (s *stubProc) kill() {
	if !s.reaped {
		unix.PidfdSendSignal(s.pidfd, unix.SIGKILL, nil, 0)
	}
	s.reap()
	s.closeFDs()
	s.pipes.closeAll()
	s.cg.remove()
}

// reap waits for the stub to end, once.
func (s *stubProc) reap() {
	if !s.reaped {
		<-s.wait
		s.reaped = true
	}
}

// closeFDs closes the agent's descriptors of the stub, once.
func (s *stubProc) closeFDs() {
	for _, fd := range []*int{&s.ctl, &s.status, &s.pidfd} {
		if *fd >= 0 {
			unix.Close(*fd)
			*fd = -1
		}
	}
}

// readTimeout reads len(b) bytes from fd, or fewer at EOF, waiting at
// most d in all.
func readTimeout(fd int, b []byte, d time.Duration) (int, error) {
	deadline := time.Now().Add(d)
	n := 0
	for n < len(b) {
		left := time.Until(deadline)
		if left <= 0 {
			return n, os.ErrDeadlineExceeded
		}
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if _, err := unix.Poll(pfd, int(left.Milliseconds())+1); err != nil && !errors.Is(err, unix.EINTR) {
			return n, err
		}
		if pfd[0].Revents == 0 {
			continue
		}
		m, err := unix.Read(fd, b[n:])
		switch {
		case errors.Is(err, unix.EINTR):
		case err != nil:
			return n, err
		case m == 0:
			return n, nil
		}
		n += max(m, 0)
	}
	return n, nil
}

// encodeStubRequest lays a request out as NUL-ended fields: the program,
// the directory, the count of arguments, the arguments, the environment.
// It reports false for a request a stub cannot carry: a string with a NUL
// (which the kernel would refuse), or one over maxStubRequest.
func encodeStubRequest(prog, cwd string, argv, env []string) ([]byte, bool) {
	var b bytes.Buffer
	for _, f := range append([]string{prog, cwd, strconv.Itoa(len(argv))}, append(argv, env...)...) {
		if strings.IndexByte(f, 0) >= 0 || b.Len()+len(f) >= maxStubRequest {
			return nil, false
		}
		b.WriteString(f)
		b.WriteByte(0)
	}
	return b.Bytes(), true
}

// decodeStubRequest is encodeStubRequest's inverse.
func decodeStubRequest(b []byte) (prog, cwd string, argv, env []string, err error) {
	if len(b) == 0 || b[len(b)-1] != 0 {
		return "", "", nil, nil, errors.New("exec stub: truncated request")
	}
	f := bytes.Split(b[:len(b)-1], []byte{0})
	if len(f) < 3 {
		return "", "", nil, nil, errors.New("exec stub: short request")
	}
	n, err := strconv.Atoi(string(f[2]))
	if err != nil || n < 1 || 3+n > len(f) {
		return "", "", nil, nil, errors.New("exec stub: bad argument count")
	}
	strs := make([]string, len(f))
	for i := range f {
		strs[i] = string(f[i])
	}
	return strs[0], strs[1], strs[3 : 3+n], strs[3+n:], nil
}

// RunExecStub is the stub's program (the agent binary with ExecStubArg):
// it reads one request on descriptor 3 and executes it, or writes the
// errno of its failure on descriptor 4 and exits 127. It never returns.
// The program starts with no signal blocked, as one the PID-1 agent
// forks does.
func RunExecStub() {
	runtime.LockOSThread() // the thread whose mask is cleared executes
	unix.CloseOnExec(4)
	unix.Write(4, []byte{stubReadyByte})
	var req []byte
	buf := make([]byte, 64<<10)
	for {
		n, err := unix.Read(3, buf)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if n > 0 {
			req = append(req, buf[:n]...)
			continue
		}
		break
	}
	unix.Close(3)
	unix.Write(4, []byte{stubTookByte})
	prog, cwd, argv, env, err := decodeStubRequest(req)
	if err == nil {
		err = unix.Chdir(cwd)
	}
	if err == nil {
		err = unix.PthreadSigmask(unix.SIG_SETMASK, &unix.Sigset_t{}, nil)
	}
	if err == nil {
		err = syscall.Exec(prog, argv, env)
	}
	code := uint32(unix.EINVAL)
	var errno syscall.Errno
	if errors.As(err, &errno) {
		code = uint32(errno)
	}
	var b [4]byte
	binary.NativeEndian.PutUint32(b[:], code)
	unix.Write(4, b[:])
	os.Exit(notStartedCode)
}
