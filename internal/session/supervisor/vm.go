package supervisor

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"io/fs"
	"net"
	"path/filepath"
	"sync"
	"time"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
	"isopod/internal/errdefs"
	"isopod/internal/machine"
	"isopod/internal/pausefile"
	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// VM is a session's VM: a VM the core started and holds
// (sandbox.StartVM), and the calls a session makes on it. Its methods are
// safe for concurrent use; they share the VM's one agent connection.
type VM struct {
	*sandbox.Held
	base  pausefile.ExecBase
	mu    sync.Mutex // guards execs
	execs int
	// commitMu lets one commit run at a time.
	commitMu sync.Mutex
}

// NewVM takes h's calls over.
func NewVM(h *sandbox.Held) *VM { return &VM{Held: h, base: h.ExecBase()} }

// ExecRequest is one command in a session's VM.
type ExecRequest struct {
	Argv  []string
	Shell bool // Argv[0] is a shell command line for /bin/sh -c
	Env   []string
	Cwd   string
	Stdin io.Reader
	// TimeoutS is when the guest kills the command (0:
	// sandbox.DefaultTimeoutS).
	TimeoutS int
	// Keep leaves what the command started running after it exits.
	Keep bool
}

// ExecReport is how one exec ended: a run report's exec fields.
type ExecReport struct {
	OK   bool     `json:"ok"`
	Argv []string `json:"argv"`
	report.Outcome
	ExecMS        int64  `json:"exec_ms"`
	StdoutLogPath string `json:"stdout_log_path"`
	StderrLogPath string `json:"stderr_log_path"`
}

func invalid(format string, a ...any) error {
	return fmt.Errorf(format+": %w", append(a, errdefs.ErrInvalidArgument)...)
}

// machineExec checks e and turns it into the machine's form.
func (v *VM) machineExec(e ExecRequest) (machine.Exec, error) {
	if len(e.Argv) == 0 || e.Argv[0] == "" {
		return machine.Exec{}, invalid("no command: give the program and its arguments after --")
	}
	if e.Shell && len(e.Argv) != 1 {
		return machine.Exec{}, invalid("a shell command is one string")
	}
	if e.TimeoutS < 0 || e.TimeoutS > sandbox.MaxTimeoutS {
		return machine.Exec{}, invalid("timeout_s %d: must be 1 to %d", e.TimeoutS, sandbox.MaxTimeoutS)
	}
	argv := e.Argv
	if e.Shell {
		argv = []string{"/bin/sh", "-c", e.Argv[0]}
	}
	return machine.Exec{
		Argv:    argv,
		Env:     append(append([]string(nil), v.base.Env...), e.Env...),
		Cwd:     cmp.Or(e.Cwd, v.base.Cwd),
		Timeout: time.Duration(cmp.Or(e.TimeoutS, sandbox.DefaultTimeoutS)) * time.Second,
		Stdin:   e.Stdin,
		Keep:    e.Keep,
	}, nil
}

// count counts one more exec and returns its number.
func (v *VM) count() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.execs++
	return v.execs
}

// Exec runs one command in the VM, its output kept in logs beside the
// VM's record (exec-N.stdout.log). A guest that went away is a report
// that says so.
func (v *VM) Exec(ctx context.Context, e ExecRequest) (*ExecReport, error) {
	me, err := v.machineExec(e)
	if err != nil {
		return nil, err
	}
	n := v.count()
	rep := &ExecReport{OK: true, Argv: me.Argv,
		StdoutLogPath: filepath.Join(v.base.LogDir, fmt.Sprintf("exec-%d.stdout.log", n)),
		StderrLogPath: filepath.Join(v.base.LogDir, fmt.Sprintf("exec-%d.stderr.log", n))}
	stdout, err := machine.NewCapture(rep.StdoutLogPath, sandbox.LogCap)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := machine.NewCapture(rep.StderrLogPath, sandbox.LogCap)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	me.Stdout, me.Stderr = stdout, stderr
	res, err := v.Machine().Exec(ctx, me)
	if res != nil {
		rep.ExecMS = res.Elapsed.Milliseconds()
	}
	fill := func() {
		rep.Stdout, rep.StdoutTruncated, rep.StdoutBytes = stdout.Inline()
		rep.Stderr, rep.StderrTruncated, rep.StderrBytes = stderr.Inline()
	}
	if err != nil {
		died, why := v.Died(ctx, err)
		if !died {
			return nil, err
		}
		rep.GuestDied, rep.GuestDiedReason = true, why
		fill()
		return rep, nil
	}
	rep.ExitCode, rep.Signal, rep.TimedOut = res.ExitCode, res.Signal, res.TimedOut
	fill()
	return rep, nil
}

// Execs counts the execs and jobs started so far.
func (v *VM) Execs() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.execs
}

// StartJob starts e as a background job and returns its id at once.
func (v *VM) StartJob(ctx context.Context, e ExecRequest) (agentproto.JobInfo, error) {
	if e.Stdin != nil {
		return agentproto.JobInfo{}, invalid("a background job reads no stdin")
	}
	me, err := v.machineExec(e)
	if err != nil {
		return agentproto.JobInfo{}, err
	}
	if e.TimeoutS == 0 {
		me.Timeout = 0 // a job runs until it ends or is killed
	}
	v.count()
	return v.Machine().StartJob(ctx, me)
}

// JobWait waits up to wait for job id to exit (0: no wait) and returns
// its state and the output since the last read.
func (v *VM) JobWait(ctx context.Context, id string, wait time.Duration) (agentclient.JobOutput, error) {
	if wait <= 0 {
		return v.Machine().JobRead(ctx, id, 0)
	}
	return v.Machine().JobWait(ctx, id, wait, 0)
}

// JobKill sends sig to job id's process group.
func (v *VM) JobKill(ctx context.Context, id string, sig int) error {
	return v.Machine().JobKill(ctx, id, sig)
}

// JobList lists the guest's jobs.
func (v *VM) JobList(ctx context.Context) ([]agentproto.JobInfo, error) {
	return v.Machine().JobList(ctx)
}

// PutFile copies r into the guest file at path, at most maxBytes.
func (v *VM) PutFile(ctx context.Context, path string, mode fs.FileMode, maxBytes int64, r io.Reader) (int64, error) {
	return v.Machine().PutFile(ctx, path, mode, maxBytes, r)
}

// GetFile copies the guest file at path into w, at most maxBytes.
func (v *VM) GetFile(ctx context.Context, path string, maxBytes int64, w io.WriterAt) (*agentproto.FileDone, error) {
	return v.Machine().CopyOut(ctx, path, agentclient.CopyLimits{MaxSize: maxBytes, MaxData: maxBytes}, w)
}

// Expose relays connections accepted on ln to guestPort until ctx ends.
func (v *VM) Expose(ctx context.Context, guestPort int, ln net.Listener) error {
	return v.Machine().Expose(ctx, guestPort, ln)
}
