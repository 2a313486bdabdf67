package agentclient

import (
	"context"
	"fmt"
	"time"

	"isopod/internal/agentproto"
)

// Session marks the connection as a session's: when it ends, the guest
// leaves its running execs to finish and serves the next connection. Send
// it after every handshake.
func (c *Client) Session(ctx context.Context) error {
	return c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindSession}, nil)
}

// JobOutput is a job's state and the output read from it.
type JobOutput struct {
	agentproto.JobInfo
	Stdout, Stderr []byte
}

// StartJob starts ex as a background job (Detach is set; Stdin must not
// be) and returns it as the guest first reports it.
func (c *Client) StartJob(ctx context.Context, ex agentproto.Exec) (agentproto.JobInfo, error) {
	ex.Detach = true
	f, err := c.roundTrip(ctx, &agentproto.Msg{Kind: agentproto.KindExec, Exec: &ex}, nil)
	if err != nil {
		return agentproto.JobInfo{}, err
	}
	out, err := jobReply(f)
	return out.JobInfo, err
}

// JobRead returns the job's state and the output that arrived since the
// last read, at most max bytes of each stream (0: agentproto.JobReadMax).
func (c *Client) JobRead(ctx context.Context, id string, max int) (JobOutput, error) {
	return c.jobCall(ctx, &agentproto.Msg{Kind: agentproto.KindJobRead, Job: id, MaxBytes: int64(max)})
}

// JobWait waits up to wait for the job to exit, then reads it as JobRead
// does. ctx must allow for wait.
func (c *Client) JobWait(ctx context.Context, id string, wait time.Duration, max int) (JobOutput, error) {
	return c.jobCall(ctx, &agentproto.Msg{Kind: agentproto.KindJobWait, Job: id, WaitMS: wait.Milliseconds(), MaxBytes: int64(max)})
}

func (c *Client) jobCall(ctx context.Context, m *agentproto.Msg) (JobOutput, error) {
	f, err := c.roundTrip(ctx, m, nil)
	if err != nil {
		return JobOutput{}, err
	}
	return jobReply(f)
}

// jobReply checks a KindJob reply: its counts must match its payload.
func jobReply(f frame) (JobOutput, error) {
	in := f.msg.JobInfo
	if f.msg.Kind != agentproto.KindJob || in == nil {
		return JobOutput{}, fmt.Errorf("guest answered a job request with %s", f.msg.Kind)
	}
	if in.Stdout < 0 || in.Stderr < 0 || in.Stdout+in.Stderr != len(f.payload) {
		return JobOutput{}, fmt.Errorf("guest sent %d bytes of job output but counted %d and %d", len(f.payload), in.Stdout, in.Stderr)
	}
	return JobOutput{JobInfo: *in, Stdout: f.payload[:in.Stdout], Stderr: f.payload[in.Stdout:]}, nil
}

// JobKill sends signal sig to the job's process group (once it has
// exited: to what it left running).
func (c *Client) JobKill(ctx context.Context, id string, sig int) error {
	return c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindJobKill, Job: id, Signal: sig}, nil)
}

// JobList lists the jobs the guest remembers, oldest first.
func (c *Client) JobList(ctx context.Context) ([]agentproto.JobInfo, error) {
	f, err := c.roundTrip(ctx, &agentproto.Msg{Kind: agentproto.KindJobList}, nil)
	if err != nil {
		return nil, err
	}
	if f.msg.Kind != agentproto.KindJobList {
		return nil, fmt.Errorf("guest answered job_list with %s", f.msg.Kind)
	}
	return f.msg.Jobs, nil
}

// Freeze freezes the guest's scratch filesystem, so that its disk image
// can be copied while the VM runs; the guest thaws it on its own after
// bound (0: agentproto.DefaultFreezeMS) or when this connection ends.
func (c *Client) Freeze(ctx context.Context, bound time.Duration) error {
	return c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindFreeze, FreezeMS: bound.Milliseconds()}, nil)
}

// Thaw ends Freeze's freeze. It fails when the freeze had already ended
// on its own: a copy made meanwhile may be torn.
func (c *Client) Thaw(ctx context.Context) error {
	return c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindThaw}, nil)
}
