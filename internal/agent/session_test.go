package agent

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
)

// alive reports whether process pid exists (and is not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && i+2 < len(s) && s[i+2] != 'Z'
}

// pidOf parses the first line of out as a pid and kills it at cleanup.
func pidOf(t *testing.T, out []byte) int {
	t.Helper()
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(out), "\n", 2)[0]))
	if err != nil || pid <= 1 {
		t.Fatalf("no pid in %q", out)
	}
	t.Cleanup(func() { unix.Kill(pid, unix.SIGKILL) })
	return pid
}

// waitFor polls cond for up to 10s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 10s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A kept exec returns when its process exits although what it started
// still holds the output pipes, and what it started keeps running,
// writing to those pipes without harm; a one-shot exec's leftovers die.
func TestKeepExecLeavesDaemons(t *testing.T) {
	t.Parallel()
	c := startAgent(t, Options{})
	// The daemon writes to the exec's stdout after the exec ended.
	daemon := `(sleep 0.5; while :; do echo tick; sleep 0.05; done) & echo $!`
	t0 := time.Now()
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", daemon}, Keep: true})
	if took := time.Since(t0); took > time.Second {
		t.Errorf("the kept exec took %s; want it to end with its process", took)
	}
	pid := pidOf(t, r.stdout)
	if r.code() != 0 {
		t.Fatalf("exit %d, stderr %q", r.code(), r.stderr)
	}
	time.Sleep(time.Second) // the daemon writes to the pipe meanwhile
	if !alive(pid) {
		t.Errorf("the kept exec's daemon (pid %d) died after the exec ended", pid)
	}

	one := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", daemon}})
	opid := pidOf(t, one.stdout)
	waitFor(t, "the one-shot exec's leftover to die", func() bool { return !alive(opid) })
}

// A kept exec whose leftover holds the pipes returns promptly, with every
// byte the process wrote before it exited.
func TestKeepExecOutputEndsWithProcess(t *testing.T) {
	c := startAgent(t, Options{})
	t0 := time.Now()
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", "sleep 100 & echo $! >&2; head -c 300000 /dev/zero"}, Keep: true})
	took := time.Since(t0)
	pidOf(t, r.stderr)
	if len(r.stdout) != 300000 || r.code() != 0 {
		t.Errorf("got %d bytes, exit %d; want all 300000 and 0", len(r.stdout), r.code())
	}
	if took > 2*time.Second {
		t.Errorf("`sleep 100 &` kept the exec %s", took)
	}
}

// A leftover that writes without pause holds a kept exec for at most
// keepDrainMax after its process exited, and keeps running.
func TestKeepExecChattyLeftover(t *testing.T) {
	t.Parallel()
	c := startAgent(t, Options{})
	t0 := time.Now()
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", "echo $$ >&2; (while :; do echo tick; done) & echo $! >&2"}, Keep: true})
	took := time.Since(t0)
	lines := strings.Fields(string(r.stderr))
	if len(lines) != 2 {
		t.Fatalf("stderr %q; want two pids", r.stderr)
	}
	pid := pidOf(t, []byte(lines[1]))
	if took > keepDrainMax+time.Second {
		t.Errorf("the exec took %s; want at most about %s", took, keepDrainMax)
	}
	time.Sleep(200 * time.Millisecond)
	if !alive(pid) {
		t.Errorf("the chatty leftover died")
	}
}

// A kept exec's timeout kills its process group, what it started
// included, and nothing else.
func TestKeepExecTimeoutKillsItsGroup(t *testing.T) {
	c := startAgent(t, Options{})
	other := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", "sleep 100 & echo $!"}, Keep: true})
	otherPid := pidOf(t, other.stdout)
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", "sleep 100 & echo $!; sleep 100"}, Keep: true, TimeoutMS: 300})
	pid := pidOf(t, r.stdout)
	if !r.done.TimedOut {
		t.Fatalf("done %+v; want timed out", r.done)
	}
	waitFor(t, "the timed-out exec's background process to die", func() bool { return !alive(pid) })
	if !alive(otherPid) {
		t.Errorf("another kept exec's daemon died with the timeout")
	}
}

// Two execs overlap on one connection, each with its own result.
func TestConcurrentExecs(t *testing.T) {
	c := startAgent(t, Options{})
	var wg sync.WaitGroup
	res := make([]execResult, 2)
	ends := make([]time.Time, 2)
	for i, script := range []string{"sleep 0.5; echo slow", "echo fast"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = c.execWith(agentproto.Exec{Argv: []string{"sh", "-c", script}, Keep: i == 0}, nil, nil)
			ends[i] = time.Now()
		}()
	}
	wg.Wait()
	if string(res[0].stdout) != "slow\n" || string(res[1].stdout) != "fast\n" {
		t.Errorf("outputs %q and %q", res[0].stdout, res[1].stdout)
	}
	if !ends[1].Before(ends[0]) {
		t.Errorf("the fast exec waited for the slow one")
	}
}

// serveOn serves srv on a fresh socket pair and returns a client that has
// its hello, and a function that closes the host end and waits for Serve.
func serveOn(t *testing.T, srv *Server) (*agentclient.Client, func() error) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	guest := os.NewFile(uintptr(fds[0]), "guest")
	hf := os.NewFile(uintptr(fds[1]), "host")
	host, err := net.FileConn(hf)
	hf.Close()
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(context.Background(), guest) }()
	c := agentclient.New(host, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.WaitHello(ctx); err != nil {
		t.Fatalf("WaitHello: %v", err)
	}
	closed := false
	end := func() error {
		if closed {
			return nil
		}
		closed = true
		c.Close()
		select {
		case err := <-served:
			guest.Close()
			return err
		case <-time.After(5 * time.Second):
			t.Fatal("Serve did not return after the host closed")
			return nil
		}
	}
	t.Cleanup(func() { end() })
	return c, end
}

// After KindSession, a connection's end kills none of its execs, and the
// same server greets and serves the next connection, which sees the jobs.
func TestSessionOutlivesConnection(t *testing.T) {
	srv := NewServer(Options{})
	dir := t.TempDir()
	flag := filepath.Join(dir, "finished")
	c1, end1 := serveOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c1.Session(ctx); err != nil {
		t.Fatalf("Session: %v", err)
	}
	job, err := c1.StartJob(ctx, agentproto.Exec{Argv: []string{"sh", "-c", "echo from-job; sleep 100"}})
	if err != nil {
		t.Fatalf("StartJob: %v", err)
	}
	started := make(chan struct{})
	go c1.Exec(ctx, agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"sh", "-c", "echo go; sleep 0.5; touch " + flag}},
		Stdout: &firstWrite{ch: started}})
	<-started
	t0 := time.Now()
	if err := end1(); err == nil {
		t.Errorf("Serve returned nil after the host closed; want the end of stream")
	}
	if took := time.Since(t0); took > time.Second {
		t.Errorf("Serve took %s to return after a session's end", took)
	}
	waitFor(t, "the session's exec to finish after its connection ended", func() bool {
		_, err := os.Stat(flag)
		return err == nil
	})

	c2, _ := serveOn(t, srv)
	out, err := c2.JobRead(ctx, job.ID, 0)
	if err != nil || out.State != agentproto.JobRunning || string(out.Stdout) != "from-job\n" {
		t.Fatalf("JobRead on the next connection: %+v %q, %v", out.JobInfo, out.Stdout, err)
	}
	if err := c2.JobKill(ctx, job.ID, int(unix.SIGKILL)); err != nil {
		t.Fatalf("JobKill: %v", err)
	}
	if out, err := c2.JobWait(ctx, job.ID, 10*time.Second, 0); err != nil || out.Signal == nil || *out.Signal != int(unix.SIGKILL) {
		t.Errorf("JobWait after the kill: %+v, %v", out.JobInfo, err)
	}
}

// Without KindSession a connection's end kills its running execs, as it
// always did.
func TestNoSessionConnectionEndKills(t *testing.T) {
	srv := NewServer(Options{})
	c1, end1 := serveOn(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pidW := &lockedBuf{}
	started := make(chan struct{})
	go c1.Exec(ctx, agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"sh", "-c", "echo $$; sleep 100"}},
		Stdout: writers{pidW, &firstWrite{ch: started}}})
	<-started
	pid := pidOf(t, pidW.bytes())
	end1()
	waitFor(t, "the exec to be killed with its connection", func() bool { return !alive(pid) })
}

type lockedBuf struct {
	mu sync.Mutex
	b  []byte
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.b = append(l.b, p...)
	return len(p), nil
}

func (l *lockedBuf) bytes() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.b...)
}

// writers writes to each in turn.
type writers []interface{ Write([]byte) (int, error) }

func (ws writers) Write(p []byte) (int, error) {
	for _, w := range ws {
		w.Write(p)
	}
	return len(p), nil
}
