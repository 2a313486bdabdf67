package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// Exec defaults.
const (
	// DefaultPath is the baseline PATH of every exec.
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// DefaultCwd is where a process starts when the request names no cwd.
	DefaultCwd = "/root"
	// pipeDrainGrace is how long an exec waits, after its process and
	// process group are gone, for the output pipes to reach EOF. A process
	// that left the group (setsid) may hold them open forever.
	pipeDrainGrace = 200 * time.Millisecond
	// notStartedCode is the exit code for a program that could not start.
	notStartedCode = 127
)

// baseEnv is the environment every exec starts from.
// errStdinWindow is a host that sent more stdin than the window allows:
// the connection ends.
var errStdinWindow = errors.New("stdin window overrun")

var baseEnv = []string{
	"PATH=" + DefaultPath,
	"HOME=/root",
	"TERM=linux",
	"LANG=C.UTF-8",
}

// stdinFrame is one KindStdin frame queued for an exec.
type stdinFrame struct {
	data []byte
	eof  bool
}

// execState is what the reader needs to route frames to a running exec.
type execState struct {
	id    uint64
	stdin chan stdinFrame

	mu      sync.Mutex
	pgid    int           // the process group while the process runs; 0 before and after
	ended   bool          // the process has exited
	pending []unix.Signal // signals that came before the process started
}

// signal sends sig to the exec's process group, or keeps it for the
// process when it has not started yet.
func (st *execState) signal(sig unix.Signal) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch {
	case st.ended:
		return nil
	case st.pgid == 0:
		st.pending = append(st.pending, sig)
		return nil
	}
	return signalGroup(st.pgid, sig)
}

// started records the process group and delivers the signals that came
// before it.
func (st *execState) started(pgid int) error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pgid = pgid
	var errs []error
	for _, sig := range st.pending {
		errs = append(errs, signalGroup(pgid, sig))
	}
	st.pending = nil
	return errors.Join(errs...)
}

// exited records that the process is gone; later signals are dropped.
func (st *execState) exited() {
	st.mu.Lock()
	st.pgid, st.ended = 0, true
	st.mu.Unlock()
}

// stdinQueue is the per-exec stdin buffer: twice the host's window, so a
// host that respects the window never fills it.
const stdinQueue = 2 * agentproto.StdinWindow

// mergeEnv applies layers of KEY=VALUE entries in order; a later entry
// replaces an earlier one with the same key, keeping its position.
func mergeEnv(layers ...[]string) ([]string, error) {
	var out []string
	idx := make(map[string]int)
	for _, l := range layers {
		for _, kv := range l {
			if err := agentproto.ValidEnv(kv); err != nil {
				return nil, err
			}
			k := kv[:strings.IndexByte(kv, '=')]
			if i, ok := idx[k]; ok {
				out[i] = kv
				continue
			}
			idx[k] = len(out)
			out = append(out, kv)
		}
	}
	return out, nil
}

func envLookup(env []string, key string) string {
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// startErr is a reason a program could not start, shown to the user as
// stderr of the exec (exit code 127).
type startErr string

// resolveProgram finds argv0 the way a shell does: through PATH unless it
// contains a slash, in which case it is taken relative to cwd.
func resolveProgram(argv0, pathEnv, cwd string) (string, startErr) {
	if strings.Contains(argv0, "/") {
		p := argv0
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if msg := checkExecutable(p); msg != "" {
			return "", startErr(fmt.Sprintf("isopod: %s: %s\n", argv0, msg))
		}
		return p, ""
	}
	denied := ""
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		if !filepath.IsAbs(dir) {
			dir = filepath.Join(cwd, dir)
		}
		p := filepath.Join(dir, argv0)
		msg := checkExecutable(p)
		if msg == "" {
			return p, ""
		}
		if msg != "no such file or directory" && denied == "" {
			denied = fmt.Sprintf("isopod: %s: %s\n", p, msg)
		}
	}
	if denied != "" {
		return "", startErr(denied)
	}
	return "", startErr(fmt.Sprintf("isopod: %s: command not found\n", argv0))
}

// checkExecutable returns "" for an executable regular file, else why not.
func checkExecutable(p string) string {
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "no such file or directory"
	case err != nil:
		return errnoText(err)
	case st.IsDir():
		return "is a directory"
	case !st.Mode().IsRegular():
		return "not a regular file"
	case st.Mode().Perm()&0o111 == 0:
		return "permission denied (not executable)"
	}
	return ""
}

// errnoText is the bare reason of a path error ("no such file or directory").
func errnoText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// startExec registers the exec before returning, so that stdin frames that
// follow at once find it, and runs it in a handler.
func (c *conn) startExec(m *agentproto.Msg) {
	st := &execState{id: m.ID, stdin: make(chan stdinFrame, stdinQueue)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, dup := c.execs[m.ID]; dup {
		go c.replyErr(m.ID, fmt.Errorf("exec: id %d is already running; use a fresh id: %w", m.ID, errdefs.ErrInvalidArgument))
		return
	}
	c.execs[m.ID] = st
	if !c.spawnLocked(func() {
		c.runExec(st, m.Exec)
		c.mu.Lock()
		delete(c.execs, st.id)
		c.mu.Unlock()
	}) {
		delete(c.execs, m.ID)
	}
}

func (c *conn) lookupExec(id uint64) *execState {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.execs[id]
}

// routeStdin queues a stdin frame for its exec without blocking. Frames for
// an exec that has ended are dropped. A full queue means the host ignored
// the window, which ends the connection.
func (c *conn) routeStdin(m *agentproto.Msg, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.execs[m.ID]
	if st == nil {
		c.log.Debug("stdin for an exec that is not running", "id", m.ID)
		return nil
	}
	select {
	case st.stdin <- stdinFrame{data: payload, eof: m.EOF}:
		return nil
	default:
		return fmt.Errorf("exec %d: more than %d unacknowledged stdin frames (the window is %d): %w", m.ID, stdinQueue, agentproto.StdinWindow, errStdinWindow)
	}
}

func (c *conn) signalExec(m *agentproto.Msg) {
	st := c.lookupExec(m.ID)
	if st == nil {
		c.log.Debug("signal for an exec that is not running", "id", m.ID)
		return
	}
	if m.Signal <= 0 || m.Signal > 64 {
		c.log.Warn("signal out of range ignored", "id", m.ID, "signal", m.Signal)
		return
	}
	if err := st.signal(unix.Signal(m.Signal)); err != nil {
		c.log.Warn("signal failed", "id", m.ID, "signal", m.Signal, "err", err)
	}
}

func (c *conn) output(id uint64, stream, text string) {
	c.reply(&agentproto.Msg{ID: id, Kind: agentproto.KindOutput, Stream: stream}, []byte(text))
}

func (c *conn) execDone(id uint64, start time.Time, ws *unix.WaitStatus, code int, timedOut bool) {
	d := &agentproto.ExecDone{TimedOut: timedOut, DurationMS: time.Since(start).Milliseconds()}
	switch {
	case ws == nil:
		d.ExitCode = &code
	case ws.Signaled():
		s := int(ws.Signal())
		d.Signal = &s
	default:
		e := ws.ExitStatus()
		d.ExitCode = &e
	}
	c.reply(&agentproto.Msg{ID: id, Kind: agentproto.KindExecDone, Done: d}, nil)
}

// runExec runs one process to completion and sends its output and ExecDone.
func (c *conn) runExec(st *execState, req *agentproto.Exec) {
	start := time.Now()
	env, err := c.checkExecRequest(req)
	if err != nil {
		c.replyErr(st.id, err)
		return
	}
	cwd := execCwd(req.Cwd)
	prog, msg := resolveStart(req.Argv[0], env, cwd)
	if msg != "" {
		c.notStarted(st.id, start, string(msg))
		return
	}

	pid, wait, p, cg, err := c.startProcess(req, prog, cwd, env)
	if p != nil {
		defer p.closeAll()
	}
	if err != nil {
		cg.remove()
		c.notStarted(st.id, start, fmt.Sprintf("isopod: %s: %s\n", req.Argv[0], errnoText(err)))
		return
	}
	if err := st.started(pid); err != nil {
		c.log.Warn("delivering an early signal failed", "id", st.id, "err", err)
	}
	c.log.Debug("exec started", "id", st.id, "pid", pid, "argv0", req.Argv[0], "keep", req.Keep)

	if req.Keep {
		streams := c.startKeptStreams(st, p)
		ws, timedOut := c.waitExec(st, pid, wait, cg, req.TimeoutMS)
		// What the process started keeps running, in its group and
		// cgroup; its output ends here.
		st.exited()
		streams.finishKept(p)
		cg.release()
		c.execDoneThenTidy(st.id, start, &ws, timedOut, nil)
		return
	}
	streams := c.startStreams(st, p)
	ws, timedOut := c.waitExec(st, pid, wait, cg, req.TimeoutMS)
	// The direct child is gone: end whatever it left in its group and its
	// cgroup, which would otherwise hold the pipes open.
	killGroup(pid)
	cg.killAll()
	st.exited()
	streams.finish(c, st, p)
	c.execDoneThenTidy(st.id, start, &ws, timedOut, cg)
}

// execDoneThenTidy answers an exec, then (off the exec's path) removes its
// cgroup (cg; nil when it was released) and makes the next exec's cgroup
// and pipes; [Cgroups.settle] waits for that.
func (c *conn) execDoneThenTidy(id uint64, start time.Time, ws *unix.WaitStatus, timedOut bool, cg *execCgroup) {
	g := c.srv.opts.Cgroups
	g.begin()
	defer g.end()
	c.execDone(id, start, ws, 0, timedOut)
	cg.remove()
	c.srv.refillSpares()
}

// checkExecRequest rejects a malformed exec request and returns the
// environment the process gets: the base, the server's, then the request's.
// Its errors are for replyErr.
func (c *conn) checkExecRequest(req *agentproto.Exec) ([]string, error) {
	if req == nil || len(req.Argv) == 0 || req.Argv[0] == "" {
		return nil, fmt.Errorf("exec: argv is empty; name a program to run: %w", errdefs.ErrInvalidArgument)
	}
	env, err := mergeEnv(baseEnv, c.srv.execEnv(), req.Env)
	if err != nil {
		return nil, fmt.Errorf("exec: %w: %w", err, errdefs.ErrInvalidArgument)
	}
	if req.TimeoutMS < 0 {
		return nil, fmt.Errorf("exec: timeout_ms %d is negative: %w", req.TimeoutMS, errdefs.ErrInvalidArgument)
	}
	return env, nil
}

// execCwd is the directory a process starts in: DefaultCwd when the request
// names none, and relative to DefaultCwd when it is relative.
func execCwd(cwd string) string {
	if cwd == "" {
		return DefaultCwd
	}
	if !filepath.IsAbs(cwd) {
		return filepath.Join(DefaultCwd, cwd)
	}
	return cwd
}

// resolveStart checks that cwd is a directory and finds argv0 through the
// PATH of env; the startErr says why the program cannot start.
func resolveStart(argv0 string, env []string, cwd string) (string, startErr) {
	if fi, err := os.Stat(cwd); err != nil {
		return "", startErr(fmt.Sprintf("isopod: cwd %s: no such directory\n", cwd))
	} else if !fi.IsDir() {
		return "", startErr(fmt.Sprintf("isopod: cwd %s: not a directory\n", cwd))
	}
	return resolveProgram(argv0, envLookup(env, "PATH"), cwd)
}

// notStarted reports a program that could not start: msg on stderr and
// ExecDone with exit code 127.
func (c *conn) notStarted(id uint64, start time.Time, msg string) {
	c.output(id, "stderr", msg)
	c.execDone(id, start, nil, notStartedCode, false)
}

// forkExec starts prog in its own process group, in cg when there is one,
// with the child's ends of p as its standard streams; it closes those ends
// in the agent whether or not the start succeeded.
func (c *conn) forkExec(prog string, argv []string, cwd string, env []string, p *execPipes, cg *execCgroup) (int, <-chan unix.WaitStatus, error) {
	sys := &syscall.SysProcAttr{Setpgid: true}
	if cg != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, cg.fd
	}
	attr := &syscall.ProcAttr{
		Dir:   cwd,
		Env:   env,
		Files: []uintptr{p.childIn.Fd(), p.childOut.Fd(), p.childErr.Fd()},
		Sys:   sys,
	}
	pid, wait, err := c.reap.start(func() (int, error) {
		return syscall.ForkExec(prog, argv, attr)
	})
	p.closeChildEnds()
	return pid, wait, err
}

// waitExec waits for the process pid to exit. It kills the process group
// and cgroup when the timeout (if any) passes, reporting timedOut, or when
// the connection ends unless it is a session's.
func (c *conn) waitExec(st *execState, pid int, wait <-chan unix.WaitStatus, cg *execCgroup, timeoutMS int64) (ws unix.WaitStatus, timedOut bool) {
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	ctxDone := c.ctx.Done()
	for {
		select {
		case ws = <-wait:
			return ws, timedOut
		case <-timeout:
			timedOut = true
			timeout = nil
			c.log.Info("exec timed out; killing its processes", "id", st.id, "pid", pid)
			killGroup(pid)
			cg.killAll()
		case <-ctxDone:
			ctxDone = nil
			if c.session.Load() {
				// A session's connection ended: the exec runs on to its
				// end or timeout, its output going nowhere.
				continue
			}
			killGroup(pid)
			cg.killAll()
		}
	}
}
