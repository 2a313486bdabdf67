package agent

import (
	"fmt"
	"strconv"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A background job (Exec.Detach) belongs to the Server, not to the
// connection that started it: it outlives the connection, and any later
// connection reads, waits for, signals and lists it.

// jobTable holds the server's jobs, oldest first.
type jobTable struct {
	mu   sync.Mutex
	seq  int
	jobs []*job
}

// job is one background job.
type job struct {
	id    string
	name  string
	start time.Time
	st    *execState    // signals to its process group while it runs
	ended chan struct{} // closed once it has exited and its output drained

	mu       sync.Mutex // guards following
	pid      int
	cg       *execCgroup
	out, err jobStream
	done     *agentproto.ExecDone // set once exited
}

// add registers a new job, forgetting the oldest exited job when the table
// is full.
func (t *jobTable) add(argv []string, start time.Time) (*job, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.jobs) >= agentproto.MaxJobs {
		i := 0
		for i < len(t.jobs) && !t.jobs[i].exited() {
			i++
		}
		if i == len(t.jobs) {
			return nil, fmt.Errorf("exec: %d background jobs are running, the most the guest keeps; kill one first: %w", agentproto.MaxJobs, errdefs.ErrFailedPrecondition)
		}
		t.jobs = append(t.jobs[:i], t.jobs[i+1:]...)
	}
	t.seq++
	j := &job{
		id: "j" + strconv.Itoa(t.seq), name: agentproto.JobName(argv), start: start,
		st: &execState{}, ended: make(chan struct{}),
	}
	t.jobs = append(t.jobs, j)
	return j, nil
}

func (t *jobTable) get(id string) (*job, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, j := range t.jobs {
		if j.id == id {
			return j, nil
		}
	}
	return nil, fmt.Errorf("no job %q in the guest (list them with job_list): %w", id, errdefs.ErrNotFound)
}

func (t *jobTable) list() []*job {
	t.mu.Lock()
	defer t.mu.Unlock()
	return append([]*job(nil), t.jobs...)
}

func (j *job) exited() bool {
	select {
	case <-j.ended:
		return true
	default:
		return false
	}
}

// info describes the job; with max > 0 it also takes up to max unread
// bytes of each stream, returned as the payload.
func (j *job) info(max int) (agentproto.JobInfo, []byte) {
	j.mu.Lock()
	defer j.mu.Unlock()
	in := agentproto.JobInfo{ID: j.id, Name: j.name, State: agentproto.JobRunning, Pid: j.pid,
		DurationMS: time.Since(j.start).Milliseconds()}
	if d := j.done; d != nil {
		in.State, in.ExitCode, in.Signal, in.TimedOut, in.DurationMS = agentproto.JobExited, d.ExitCode, d.Signal, d.TimedOut, d.DurationMS
	}
	if max <= 0 {
		return in, nil
	}
	out, outDropped := j.out.read(max)
	errb, errDropped := j.err.read(max)
	in.Stdout, in.Stderr, in.StdoutDropped, in.StderrDropped = len(out), len(errb), outDropped, errDropped
	in.More = j.out.unread() > 0 || j.err.unread() > 0
	return in, append(out, errb...)
}

// finish records how the job ended and releases its cgroup.
func (j *job) finish(d *agentproto.ExecDone) {
	j.mu.Lock()
	j.done = d
	cg := j.cg
	j.mu.Unlock()
	cg.release()
	close(j.ended)
}

// startJob starts a background job and answers KindJob at once; a program
// that cannot start makes a job that has exited with 127.
func (c *conn) startJob(m *agentproto.Msg) {
	req := m.Exec
	start := time.Now()
	env, err := c.checkExecRequest(req)
	if err == nil && req.Stdin {
		err = fmt.Errorf("exec: a detached exec takes no stdin: %w", errdefs.ErrInvalidArgument)
	}
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	j, err := c.srv.jobs.add(req.Argv, start)
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	c.launchJob(j, req, env)
	in, _ := j.info(0)
	c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindJob, JobInfo: &in}, nil)
}

// launchJob forks the job's process and leaves a goroutine waiting for it.
func (c *conn) launchJob(j *job, req *agentproto.Exec, env []string) {
	cwd := execCwd(req.Cwd)
	notStarted := func(msg string) {
		j.mu.Lock()
		j.err.write([]byte(msg))
		j.mu.Unlock()
		code := notStartedCode
		j.finish(&agentproto.ExecDone{ExitCode: &code, DurationMS: time.Since(j.start).Milliseconds()})
	}
	prog, msg := resolveStart(req.Argv[0], env, cwd)
	if msg != "" {
		notStarted(string(msg))
		return
	}
	p, err := c.srv.pipes.take(false)
	if err != nil {
		notStarted(fmt.Sprintf("isopod: %s: %v\n", req.Argv[0], err))
		return
	}
	cg := c.srv.opts.Cgroups.forExec(c.srv.cgroupSeq.Add(1))
	pid, wait, err := c.forkExec(prog, req.Argv, cwd, env, p, cg)
	if err != nil {
		p.closeAll()
		cg.remove()
		notStarted(fmt.Sprintf("isopod: %s: %s\n", req.Argv[0], errnoText(err)))
		return
	}
	j.mu.Lock()
	j.pid, j.cg = pid, cg
	j.mu.Unlock()
	if err := j.st.started(pid); err != nil {
		c.log.Warn("delivering an early signal failed", "job", j.id, "err", err)
	}
	c.log.Debug("job started", "job", j.id, "pid", pid, "argv0", req.Argv[0])
	var pumps sync.WaitGroup
	pumps.Add(2)
	go pumpJob(p.out, &j.mu, &j.out, &pumps)
	go pumpJob(p.errR, &j.mu, &j.err, &pumps)
	go c.srv.waitJob(j, wait, cg, req.TimeoutMS, &pumps)
	g := c.srv.opts.Cgroups
	g.begin()
	go func() {
		defer g.end()
		c.srv.refillSpares()
	}()
}

// waitJob waits for a job's process, killing its group and cgroup when
// its timeout passes; then, after what it wrote has been read (for at most
// pipeDrainGrace: processes it left may hold the pipes), it records the
// end. What the process started keeps running.
func (s *Server) waitJob(j *job, wait <-chan unix.WaitStatus, cg *execCgroup, timeoutMS int64, pumps *sync.WaitGroup) {
	var timeout <-chan time.Time
	if timeoutMS > 0 {
		t := time.NewTimer(time.Duration(timeoutMS) * time.Millisecond)
		defer t.Stop()
		timeout = t.C
	}
	timedOut := false
	var ws unix.WaitStatus
	for waiting := true; waiting; {
		select {
		case ws = <-wait:
			waiting = false
		case <-timeout:
			timedOut, timeout = true, nil
			s.log.Info("job timed out; killing its processes", "job", j.id)
			killGroup(j.pid)
			cg.killAll()
		}
	}
	j.st.exited()
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(pipeDrainGrace):
	}
	d := &agentproto.ExecDone{TimedOut: timedOut, DurationMS: time.Since(j.start).Milliseconds()}
	if ws.Signaled() {
		sig := int(ws.Signal())
		d.Signal = &sig
	} else {
		code := ws.ExitStatus()
		d.ExitCode = &code
	}
	j.finish(d)
}

// KillAll kills every running background job, its process group and
// cgroup, what kept execs and jobs left in their cgroups, and the exec
// stub made ahead: what a power-off does to a guest, for an agent that
// serves as a plain process (tests, the fake VMM), whose jobs would
// otherwise outlive it. Processes that a kept exec left outside any
// cgroup (commands not confined) are not tracked and are not killed.
func (s *Server) KillAll() {
	for _, j := range s.jobs.list() {
		if j.exited() {
			continue
		}
		if err := j.st.signal(unix.SIGKILL); err != nil {
			s.log.Debug("killing a job", "job", j.id, "err", err)
		}
		j.mu.Lock()
		cg := j.cg
		j.mu.Unlock()
		cg.killAll()
	}
	s.opts.Cgroups.killLeftovers()
	if st := s.stub.take(); st != nil {
		st.kill()
	}
}
