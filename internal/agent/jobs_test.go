package agent

import (
	"bytes"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// A job answers at once with its id, runs in the background, and gives
// its output read by read and its end once waited for.
func TestJobLifecycle(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	t0 := time.Now()
	j, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"sh", "-c", "echo out; echo err >&2; sleep 0.5; echo more; exit 3"}})
	if err != nil {
		t.Fatalf("StartJob: %v", err)
	}
	if j.ID != "j1" || j.State != agentproto.JobRunning || j.Pid <= 0 || time.Since(t0) > 400*time.Millisecond {
		t.Fatalf("job %+v after %s; want j1 running at once", j, time.Since(t0))
	}
	done, err := c.JobWait(ctx, j.ID, 10*time.Second, 0)
	if err != nil {
		t.Fatalf("JobWait: %v", err)
	}
	if done.State != agentproto.JobExited || done.ExitCode == nil || *done.ExitCode != 3 ||
		string(done.Stdout) != "out\nmore\n" || string(done.Stderr) != "err\n" || done.More {
		t.Errorf("after the wait: %+v %q %q", done.JobInfo, done.Stdout, done.Stderr)
	}
	again, err := c.JobRead(ctx, j.ID, 0)
	if err != nil || len(again.Stdout)+len(again.Stderr) != 0 || again.State != agentproto.JobExited {
		t.Errorf("a second read: %+v %q, %v; want no output", again.JobInfo, again.Stdout, err)
	}
	list, err := c.JobList(ctx)
	if err != nil || len(list) != 1 || list[0].ID != "j1" || !strings.Contains(list[0].Name, "echo out") {
		t.Errorf("JobList: %+v, %v", list, err)
	}
}

// JobKill signals a running job's group; JobWait with a short wait
// returns a running job; bad requests are refused with their class.
func TestJobKillAndRefusals(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	j, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"sleep", "100"}})
	if err != nil {
		t.Fatal(err)
	}
	if r, err := c.JobWait(ctx, j.ID, 50*time.Millisecond, 0); err != nil || r.State != agentproto.JobRunning {
		t.Errorf("a short wait: %+v, %v; want running", r.JobInfo, err)
	}
	if err := c.JobKill(ctx, j.ID, int(unix.SIGTERM)); err != nil {
		t.Fatal(err)
	}
	r, err := c.JobWait(ctx, j.ID, 10*time.Second, 0)
	if err != nil || r.Signal == nil || *r.Signal != int(unix.SIGTERM) {
		t.Errorf("after SIGTERM: %+v, %v", r.JobInfo, err)
	}
	if _, err := c.JobRead(ctx, "j99", 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("reading an unknown job: %v; want not found", err)
	}
	if err := c.JobKill(ctx, j.ID, 0); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("signal 0: %v; want invalid argument", err)
	}
	if _, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"cat"}, Stdin: true}); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("a job with stdin: %v; want invalid argument", err)
	}
	nf, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"no-such-program-here"}})
	if err != nil {
		t.Fatal(err)
	}
	r, err = c.JobRead(ctx, nf.ID, 0)
	if err != nil || r.ExitCode == nil || *r.ExitCode != notStartedCode || !strings.Contains(string(r.Stderr), "command not found") {
		t.Errorf("a job that cannot start: %+v %q, %v", r.JobInfo, r.Stderr, err)
	}
}

// A job's timeout kills it and says so.
func TestJobTimeout(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	j, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"sleep", "100"}, TimeoutMS: 200})
	if err != nil {
		t.Fatal(err)
	}
	r, err := c.JobWait(ctx, j.ID, 10*time.Second, 0)
	if err != nil || !r.TimedOut || r.Signal == nil {
		t.Errorf("a timed-out job: %+v, %v", r.JobInfo, err)
	}
}

// More output than the buffer holds keeps the newest JobBuffer bytes and
// counts the dropped ones; reads are capped and say More.
func TestJobOutputBounded(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	const total = 3 << 20
	// Each line is its offset, so what is kept can be checked in place.
	j, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"sh", "-c", "seq 1000000 | head -c 3145728"}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := c.JobWait(ctx, j.ID, 10*time.Second, 1000)
	if err != nil || first.State != agentproto.JobExited {
		t.Fatalf("JobWait: %+v, %v", first.JobInfo, err)
	}
	if len(first.Stdout) != 1000 || first.StdoutDropped != total-agentproto.JobBuffer || !first.More {
		t.Errorf("first read: %d bytes, %d dropped, more %v; want 1000, %d, true", len(first.Stdout), first.StdoutDropped, first.More, total-agentproto.JobBuffer)
	}
	got := append([]byte(nil), first.Stdout...)
	for i := 0; i < 10; i++ {
		r, err := c.JobRead(ctx, j.ID, 0)
		if err != nil || r.StdoutDropped != 0 || len(r.Stdout) > agentproto.JobReadMax {
			t.Fatalf("read: %+v, %v", r.JobInfo, err)
		}
		got = append(got, r.Stdout...)
		if !r.More {
			break
		}
	}
	var want bytes.Buffer
	for i := 1; want.Len() < total; i++ {
		want.WriteString(strconv.Itoa(i) + "\n")
	}
	if w := want.Bytes()[total-agentproto.JobBuffer : total]; !bytes.Equal(got, w) {
		t.Errorf("kept %d bytes; want the last %d of the stream", len(got), agentproto.JobBuffer)
	}
}

func TestJobStream(t *testing.T) {
	var s jobStream
	s.write([]byte("abc"))
	if p, d := s.read(2); string(p) != "ab" || d != 0 {
		t.Errorf("read(2) = %q, %d", p, d)
	}
	big := bytes.Repeat([]byte("x"), agentproto.JobBuffer)
	s.write(big)
	// "c" and two x are dropped: the newest JobBuffer bytes stay.
	s.write([]byte("yz"))
	p, d := s.read(agentproto.JobBuffer + 10)
	if len(p) != agentproto.JobBuffer || d != 3 || string(p[len(p)-2:]) != "yz" {
		t.Errorf("after an overflow: %d bytes, %d dropped", len(p), d)
	}
	if p, d := s.read(10); len(p) != 0 || d != 0 {
		t.Errorf("empty read: %q, %d", p, d)
	}
}

// The guest remembers MaxJobs jobs: one more is refused while all run,
// and forgets the oldest exited job once one has exited.
func TestJobTableFull(t *testing.T) {
	c := startAgent(t, Options{})
	ctx := c.ctx()
	var ids []string
	for range agentproto.MaxJobs {
		j, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"sleep", "100"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	if _, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"true"}}); !errors.Is(err, errdefs.ErrFailedPrecondition) {
		t.Fatalf("a job over the limit: %v; want failed precondition", err)
	}
	if err := c.JobKill(ctx, ids[3], int(unix.SIGKILL)); err != nil {
		t.Fatal(err)
	}
	if _, err := c.JobWait(ctx, ids[3], 10*time.Second, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := c.StartJob(ctx, agentproto.Exec{Argv: []string{"true"}}); err != nil {
		t.Fatalf("a job once one exited: %v", err)
	}
	if _, err := c.JobRead(ctx, ids[3], 0); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("the exited job: %v; want forgotten", err)
	}
	for _, id := range ids {
		c.JobKill(ctx, id, int(unix.SIGKILL))
	}
}
