package machine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/vmm"
)

// ExecGrace is how much longer than a command's timeout the host waits for
// its end: the guest enforces the timeout, the host only bounds the wait.
const ExecGrace = 5 * time.Second

// errNoAgent: a call before the VM's agent answered, or after Stop.
var errNoAgent = fmt.Errorf("the VM has no agent to call: %w", errdefs.ErrFailedPrecondition)

// Start starts cfg's VMM with drv as the Machine's VMM (a previous one must
// have been dropped) and opens the agent client on its channel. cfg.Net
// is the Machine's network when it has one and cfg names none.
func (v *Machine) Start(ctx context.Context, drv vmm.Driver, cfg vmm.Config) (vmm.Machine, error) {
	if cfg.Net == nil && v.Net != nil {
		cfg.Net = v.Net.VMMNet()
	}
	m, err := drv.Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	v.Attach(m)
	return m, nil
}

// BootError is a guest that booted but could not assemble its root
// filesystem, as its Hello says.
type BootError struct{ Reason string }

func (e *BootError) Error() string {
	return fmt.Sprintf("the guest could not assemble its root filesystem (%s)", e.Reason)
}

// Unwrap classes a boot error as a failed precondition.
func (e *BootError) Unwrap() error { return errdefs.ErrFailedPrecondition }

// Boot is a cold boot: Start, then the wait for the agent's Hello, within
// ctx. A guest whose Hello carries a boot error fails with *BootError.
func (v *Machine) Boot(ctx context.Context, drv vmm.Driver, cfg vmm.Config) error {
	if _, err := v.Start(ctx, drv, cfg); err != nil {
		return fmt.Errorf("starting the VM: %w", err)
	}
	hello, err := v.Hello(ctx, (*agentclient.Client).WaitHello)
	if err != nil {
		return err
	}
	if hello.BootError != "" {
		return &BootError{Reason: hello.BootError}
	}
	return nil
}

// agent is the agent client, or errNoAgent.
func (v *Machine) agent() (*agentclient.Client, error) {
	if _, c := v.Current(); c != nil {
		return c, nil
	}
	return nil, errNoAgent
}

// Configure sends a cold-booted guest the host's clock and, when the
// Machine has a network, its network settings; it returns the guest's
// address on it ("" without one).
func (v *Machine) Configure(ctx context.Context) (guestIP string, err error) {
	c, err := v.agent()
	if err != nil {
		return "", err
	}
	if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindSyncClock, Clock: &agentproto.Clock{UnixNano: time.Now().UnixNano()}}, nil); err != nil {
		return "", fmt.Errorf("setting the guest clock: %w", err)
	}
	if n := v.Net; n != nil {
		if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindConfigureNet, Net: n.AgentConfig()}, nil); err != nil {
			return "", fmt.Errorf("configuring the guest network: %w", err)
		}
		return n.GuestIP(), nil
	}
	return "", nil
}

// Mount has the guest assemble its root from d (workspaceDir: where a
// workspace disk goes; flush: after a resume, drop what it cached of the
// snapshot's placeholders first), waiting for the disks until deadline.
func (v *Machine) Mount(ctx context.Context, d Disks, workspaceDir string, flush bool, deadline time.Time) error {
	return v.mount(ctx, d.Mount(workspaceDir, flush, deadline), deadline)
}

// mount sends the guest m, bounded by deadline.
func (v *Machine) mount(ctx context.Context, m agentproto.Mount, deadline time.Time) error {
	c, err := v.agent()
	if err != nil {
		return err
	}
	mctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return c.Call(mctx, &agentproto.Msg{Kind: agentproto.KindMount, Mount: &m}, nil)
}

// Exec is one command for the guest. A Machine runs any number of them,
// one after another, each with its own limits and streams.
type Exec struct {
	Argv []string
	Env  []string // KEY=VALUE, the whole environment
	Cwd  string
	// Timeout is when the guest kills the command (at least 1 ms).
	Timeout time.Duration
	// Stdin feeds the command (nil: empty); Stdout and Stderr receive its
	// output as it comes.
	Stdin          io.Reader
	Stdout, Stderr io.Writer
	// Keep leaves what the command started running after it exits (a
	// session's daemons); its output ends when it exits.
	Keep bool
}

// ExecResult is how one command ended and how long the call took.
type ExecResult struct {
	agentproto.ExecDone
	Elapsed time.Duration
}

// Exec runs e in the guest, streaming its output. A guest that never
// reports the end within the timeout and ExecGrace gives a timed-out
// result with what arrived. The result's Elapsed is set on every path; an
// error with a result means the output could not be kept.
func (v *Machine) Exec(ctx context.Context, e Exec) (*ExecResult, error) {
	c, err := v.agent()
	if err != nil {
		return nil, err
	}
	timeout := max(e.Timeout, time.Millisecond)
	er := agentclient.ExecRequest{
		Exec:   agentproto.Exec{Argv: e.Argv, Env: e.Env, Cwd: e.Cwd, TimeoutMS: timeout.Milliseconds(), Keep: e.Keep},
		Stdin:  e.Stdin,
		Stdout: orDiscard(e.Stdout),
		Stderr: orDiscard(e.Stderr),
	}
	ectx, cancel := context.WithTimeout(ctx, timeout+ExecGrace)
	defer cancel()
	t := time.Now()
	done, err := c.Exec(ectx, er)
	res := &ExecResult{Elapsed: time.Since(t)}
	switch {
	case err != nil && done == nil:
		if ctx.Err() == nil && ectx.Err() != nil {
			// The guest never reported: a timeout, with what arrived.
			res.TimedOut = true
			return res, nil
		}
		return res, fmt.Errorf("running the command: %w", err)
	case err != nil:
		return res, fmt.Errorf("keeping the command's output: %w", err)
	}
	res.ExecDone = *done
	return res, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// Halt asks the guest to sync its disks and power off, within timeout,
// then ends the VMM. Once the guest has answered, its disks are synced and
// its scratch filesystem frozen, and what it wrote is in the disk files
// (the VMM writes through to the host; it only leaves flushes out), so the
// VMM is killed then instead of waiting for the guest's power-off. Without
// an answer it is given exitWait to exit on its own. The network stays
// until Close.
func (v *Machine) Halt(ctx context.Context, timeout time.Duration) error {
	var err error
	if c, cerr := v.agent(); cerr == nil {
		hctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		err = c.Call(hctx, &agentproto.Msg{Kind: agentproto.KindHalt, Sync: true}, nil)
		cancel()
		if err == nil {
			v.Kill()
		}
	} else if !errors.Is(cerr, errNoAgent) {
		err = cerr
	}
	v.Stop()
	return err
}
