package agent

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
)

// jobReadMax is the per-stream cap of one read: the request's, within
// agentproto.JobReadMax.
func jobReadMax(req int64) int {
	if req <= 0 || req > agentproto.JobReadMax {
		return agentproto.JobReadMax
	}
	return int(req)
}

// jobRead answers KindJobRead and, after its wait, KindJobWait: the job's
// state and the output that arrived since the last read.
func (c *conn) jobRead(m *agentproto.Msg) {
	j, err := c.srv.jobs.get(m.Job)
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	if m.Kind == agentproto.KindJobWait {
		if m.WaitMS < 0 || m.WaitMS > agentproto.MaxJobWaitMS {
			c.replyErr(m.ID, fmt.Errorf("job_wait: wait_ms %d is outside 0..%d: %w", m.WaitMS, agentproto.MaxJobWaitMS, errdefs.ErrInvalidArgument))
			return
		}
		t := time.NewTimer(time.Duration(m.WaitMS) * time.Millisecond)
		select {
		case <-j.ended:
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
		t.Stop()
	}
	in, payload := j.info(jobReadMax(m.MaxBytes))
	c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindJob, JobInfo: &in}, payload)
}

// jobKill sends a signal to a running job's process group, or to what an
// exited job left in its cgroup.
func (c *conn) jobKill(m *agentproto.Msg) {
	j, err := c.srv.jobs.get(m.Job)
	if err != nil {
		c.replyErr(m.ID, err)
		return
	}
	if m.Signal <= 0 || m.Signal > 64 {
		c.replyErr(m.ID, fmt.Errorf("job_kill: signal %d is outside 1..64: %w", m.Signal, errdefs.ErrInvalidArgument))
		return
	}
	sig := unix.Signal(m.Signal)
	if j.exited() {
		j.mu.Lock()
		cg := j.cg
		j.mu.Unlock()
		err = cg.signalAll(sig)
	} else {
		err = j.st.signal(sig)
	}
	if err != nil {
		c.replyErr(m.ID, fmt.Errorf("job_kill %s: %w", j.id, err))
		return
	}
	c.replyOK(m.ID)
}

// jobList answers KindJobList with every job the guest remembers.
func (c *conn) jobList(m *agentproto.Msg) {
	var infos []agentproto.JobInfo
	for _, j := range c.srv.jobs.list() {
		in, _ := j.info(0)
		infos = append(infos, in)
	}
	c.reply(&agentproto.Msg{ID: m.ID, Kind: agentproto.KindJobList, Jobs: infos}, nil)
}
