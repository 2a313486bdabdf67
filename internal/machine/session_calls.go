package machine

import (
	"context"
	"io"
	"io/fs"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
)

// The calls a session makes on its VM besides Exec: the connection's
// session mark, background jobs and copy-in. Each is one agent request;
// see agentproto's Sessions.

// Session marks the agent connection as a session's, so that its end
// (a pause, a host that reconnects) kills nothing in the guest. Call it
// after every boot, resume or reconnect.
func (v *Machine) Session(ctx context.Context) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	return c.Session(ctx)
}

// StartJob starts e as a background job in the guest and returns at once.
// e.Stdin must be nil (the job reads /dev/null) and its output is kept in
// the guest, read with JobRead; e.Timeout, when set, kills the job's
// processes after that long.
func (v *Machine) StartJob(ctx context.Context, e Exec) (agentproto.JobInfo, error) {
	c, err := v.agent()
	if err != nil {
		return agentproto.JobInfo{}, err
	}
	return c.StartJob(ctx, agentproto.Exec{Argv: e.Argv, Env: e.Env, Cwd: e.Cwd, TimeoutMS: e.Timeout.Milliseconds(), Stdin: e.Stdin != nil})
}

// JobRead returns job id's state and its output since the last read, at
// most max bytes of each stream (0: agentproto.JobReadMax).
func (v *Machine) JobRead(ctx context.Context, id string, max int) (agentclient.JobOutput, error) {
	c, err := v.agent()
	if err != nil {
		return agentclient.JobOutput{}, err
	}
	return c.JobRead(ctx, id, max)
}

// JobWait waits up to wait for job id to exit, then reads it as JobRead.
func (v *Machine) JobWait(ctx context.Context, id string, wait time.Duration, max int) (agentclient.JobOutput, error) {
	c, err := v.agent()
	if err != nil {
		return agentclient.JobOutput{}, err
	}
	return c.JobWait(ctx, id, wait, max)
}

// JobKill sends sig to job id's process group.
func (v *Machine) JobKill(ctx context.Context, id string, sig int) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	return c.JobKill(ctx, id, sig)
}

// JobList lists the guest's jobs, oldest first.
func (v *Machine) JobList(ctx context.Context) ([]agentproto.JobInfo, error) {
	c, err := v.agent()
	if err != nil {
		return nil, err
	}
	return c.JobList(ctx)
}

// PutFile copies r into the guest file at path (mode's permission bits;
// 0: 0644), at most maxBytes bytes (0: no limit); the file appears
// complete or not at all.
func (v *Machine) PutFile(ctx context.Context, path string, mode fs.FileMode, maxBytes int64, r io.Reader) (int64, error) {
	c, err := v.agent()
	if err != nil {
		return 0, err
	}
	return c.PutFile(ctx, path, mode, maxBytes, r)
}

// Freeze freezes the guest's scratch filesystem for a copy of its disk
// image, at most bound long (see agentproto's KindFreeze); Thaw ends it.
func (v *Machine) Freeze(ctx context.Context, bound time.Duration) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	return c.Freeze(ctx, bound)
}

// Thaw ends Freeze's freeze; it fails when the freeze ended on its own
// first.
func (v *Machine) Thaw(ctx context.Context) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	return c.Thaw(ctx)
}
