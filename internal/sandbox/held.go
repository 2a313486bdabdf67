package sandbox

import (
	"cmp"
	"context"
	"errors"
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
)

// A held VM is one that outlives the call that started it (a session's):
// StartVM admits, plans and boots it exactly as Run does (the request's
// checks, the warm pool, the network, the workspace, the jail), marks its
// agent connection a session's, and hands it back; its execs run one
// after another through Held.Exec until Close.

// Held is a VM started by StartVM. Its methods are safe for concurrent
// use; execs and the other agent calls share its one connection.
type Held struct {
	r     *run
	once  sync.Once
	mu    sync.Mutex // guards execs
	execs int
}

// HeldInfo says what a held VM is.
type HeldInfo struct {
	VMID         string   `json:"vm_id"`
	Name         string   `json:"name"`
	Path         string   `json:"path"` // "cold" or "warm"
	BootMS       *int64   `json:"boot_ms,omitempty"`
	ResumeMS     *int64   `json:"resume_ms,omitempty"`
	GuestIP      string   `json:"guest_ip,omitempty"`
	RootfsFlavor string   `json:"rootfs_flavor"`
	Warnings     []string `json:"warnings,omitempty"`
	SerialLog    string   `json:"serial_log_path"`
}

// heldArgv stands for a held VM's command in its record.
var heldArgv = []string{"(session)"}

// checkHeld refuses what belongs to a run's one command.
func checkHeld(req Request) error {
	if len(req.Argv) > 0 || req.Stdin != nil || len(req.CopyOut) > 0 || req.CommitAs != "" {
		return invalid("a held VM takes no command, stdin, copy-out or commit: give them to its execs")
	}
	if req.Workspace != nil && req.Workspace.Out != "" {
		return invalid("a held VM brings no workspace patch back: drop --workspace-out")
	}
	return nil
}

// CheckVM refuses, without starting anything, what StartVM would refuse
// before its VM starts: the request's fields, its base or stage, its
// workspace directory, its credentials.
func (s *Service) CheckVM(ctx context.Context, req Request) error {
	if err := checkHeld(req); err != nil {
		return err
	}
	req.Argv = heldArgv
	req, _, _, err := s.admit(ctx, req)
	if err != nil {
		return err
	}
	req.Workspace.release()
	return nil
}

// StartVM boots a VM for req as Run would and keeps it. req.Argv, Stdin,
// CopyOut and CommitAs belong to a run's one command and are refused;
// req.TimeoutS bounds the boot. The caller must Close the result.
func (s *Service) StartVM(ctx context.Context, req Request) (_ *Held, retErr error) {
	if err := checkHeld(req); err != nil {
		return nil, err
	}
	req.Argv = heldArgv
	t0 := time.Now()
	req, pl, _, err := s.admit(ctx, req)
	if err != nil {
		return nil, err
	}
	r := &run{s: s, req: req, t0: t0, plan: pl, vm: machine.New(s.log)}
	r.warm = s.warmFor(ctx, req, pl)
	h := &Held{r: r}
	defer func() {
		if retErr != nil {
			h.Close()
		}
	}()
	if err := r.prepare(); err != nil {
		return nil, err
	}
	if err := r.packWorkspace(ctx); err != nil {
		r.unrecord = true
		return nil, err
	}
	if err := r.boot(ctx); err != nil {
		return nil, heldBootErr(err)
	}
	if err := r.configure(ctx); err != nil {
		return nil, heldBootErr(err)
	}
	if err := r.vm.Session(ctx); err != nil {
		return nil, fmt.Errorf("marking the VM's connection a session's: %w", err)
	}
	return h, nil
}

func heldBootErr(err error) error {
	if errors.Is(err, errBootTimeout) {
		return fmt.Errorf("the VM was not ready within its boot timeout; raise --timeout-s: %w", errdefs.ErrUnavailable)
	}
	return err
}

// Info describes the held VM.
func (h *Held) Info() HeldInfo {
	rep := h.r.rep
	return HeldInfo{VMID: rep.VMID, Name: rep.Name, Path: rep.Path, BootMS: rep.BootMS, ResumeMS: rep.ResumeMS,
		GuestIP: rep.GuestIP, RootfsFlavor: rep.RootfsFlavor, Warnings: rep.Warnings, SerialLog: rep.SerialLogPath}
}

// Done is closed when the VMM has exited.
func (h *Held) Done() <-chan struct{} {
	m, _ := h.r.vm.Current()
	if m == nil {
		c := make(chan struct{})
		close(c)
		return c
	}
	return m.Done()
}

// ExecRequest is one command in a held VM.
type ExecRequest struct {
	Argv  []string
	Shell bool // Argv[0] is a shell command line for /bin/sh -c
	Env   []string
	Cwd   string
	Stdin io.Reader
	// TimeoutS is when the guest kills the command (0: DefaultTimeoutS).
	TimeoutS int
	// Keep leaves what the command started running after it exits.
	Keep bool
}

// ExecReport is how one exec in a held VM ended: a run report's exec
// fields.
type ExecReport struct {
	OK              bool     `json:"ok"`
	Argv            []string `json:"argv"`
	ExitCode        *int     `json:"exit_code"`
	Signal          *int     `json:"signal"`
	TimedOut        bool     `json:"timed_out"`
	GuestDied       bool     `json:"guest_died"`
	GuestDiedReason string   `json:"guest_died_reason,omitempty"`
	Stdout          string   `json:"stdout"`
	Stderr          string   `json:"stderr"`
	StdoutTruncated bool     `json:"stdout_truncated"`
	StderrTruncated bool     `json:"stderr_truncated"`
	StdoutBytes     int64    `json:"stdout_bytes"`
	StderrBytes     int64    `json:"stderr_bytes"`
	ExecMS          int64    `json:"exec_ms"`
	StdoutLogPath   string   `json:"stdout_log_path"`
	StderrLogPath   string   `json:"stderr_log_path"`
}

// machineExec checks e and turns it into the machine's form.
func (h *Held) machineExec(e ExecRequest) (machine.Exec, error) {
	if len(e.Argv) == 0 || e.Argv[0] == "" {
		return machine.Exec{}, invalid("no command: give the program and its arguments after --")
	}
	if e.Shell && len(e.Argv) != 1 {
		return machine.Exec{}, invalid("a shell command is one string")
	}
	if e.TimeoutS < 0 || e.TimeoutS > MaxTimeoutS {
		return machine.Exec{}, invalid("timeout_s %d: must be 1 to %d", e.TimeoutS, MaxTimeoutS)
	}
	argv := e.Argv
	if e.Shell {
		argv = []string{"/bin/sh", "-c", e.Argv[0]}
	}
	r := h.r
	return machine.Exec{
		Argv:    argv,
		Env:     r.spec().ExecEnv(e.Env),
		Cwd:     cmp.Or(e.Cwd, r.workspaceDir(), r.plan.cwd),
		Timeout: time.Duration(cmp.Or(e.TimeoutS, DefaultTimeoutS)) * time.Second,
		Stdin:   e.Stdin,
		Keep:    e.Keep,
	}, nil
}

// Exec runs one command in the held VM, its output kept in logs beside
// the VM's record (exec-N.stdout.log). A guest that went away is a report
// that says so.
func (h *Held) Exec(ctx context.Context, e ExecRequest) (*ExecReport, error) {
	me, err := h.machineExec(e)
	if err != nil {
		return nil, err
	}
	h.mu.Lock()
	h.execs++
	n := h.execs
	h.mu.Unlock()
	dir := h.r.dir.Path()
	rep := &ExecReport{OK: true, Argv: me.Argv,
		StdoutLogPath: filepath.Join(dir, fmt.Sprintf("exec-%d.stdout.log", n)),
		StderrLogPath: filepath.Join(dir, fmt.Sprintf("exec-%d.stderr.log", n))}
	stdout, err := machine.NewCapture(rep.StdoutLogPath, LogCap)
	if err != nil {
		return nil, err
	}
	defer stdout.Close()
	stderr, err := machine.NewCapture(rep.StderrLogPath, LogCap)
	if err != nil {
		return nil, err
	}
	defer stderr.Close()
	me.Stdout, me.Stderr = stdout, stderr
	res, err := h.r.vm.Exec(ctx, me)
	if res != nil {
		rep.ExecMS = res.Elapsed.Milliseconds()
	}
	fill := func() {
		rep.Stdout, rep.StdoutTruncated, rep.StdoutBytes = stdout.Inline()
		rep.Stderr, rep.StderrTruncated, rep.StderrBytes = stderr.Inline()
	}
	if err != nil {
		if h.r.died(ctx, err) {
			rep.GuestDied = true
			rep.GuestDiedReason = h.r.vm.Died(h.r.rep.SerialLogPath)
			fill()
			return rep, nil
		}
		return nil, err
	}
	rep.ExitCode, rep.Signal, rep.TimedOut = res.ExitCode, res.Signal, res.TimedOut
	fill()
	return rep, nil
}

// Execs counts the execs started so far.
func (h *Held) Execs() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.execs
}

// StartJob starts e as a background job and returns its id at once.
func (h *Held) StartJob(ctx context.Context, e ExecRequest) (agentproto.JobInfo, error) {
	if e.Stdin != nil {
		return agentproto.JobInfo{}, invalid("a background job reads no stdin")
	}
	me, err := h.machineExec(e)
	if err != nil {
		return agentproto.JobInfo{}, err
	}
	if e.TimeoutS == 0 {
		me.Timeout = 0 // a job runs until it ends or is killed
	}
	h.mu.Lock()
	h.execs++
	h.mu.Unlock()
	return h.r.vm.StartJob(ctx, me)
}

// JobWait waits up to wait for job id to exit (0: no wait) and returns
// its state and the output since the last read.
func (h *Held) JobWait(ctx context.Context, id string, wait time.Duration) (agentclient.JobOutput, error) {
	if wait <= 0 {
		return h.r.vm.JobRead(ctx, id, 0)
	}
	return h.r.vm.JobWait(ctx, id, wait, 0)
}

// JobKill sends sig to job id's process group.
func (h *Held) JobKill(ctx context.Context, id string, sig int) error {
	return h.r.vm.JobKill(ctx, id, sig)
}

// JobList lists the guest's jobs.
func (h *Held) JobList(ctx context.Context) ([]agentproto.JobInfo, error) {
	return h.r.vm.JobList(ctx)
}

// PutFile copies r into the guest file at path, at most maxBytes.
func (h *Held) PutFile(ctx context.Context, path string, mode fs.FileMode, maxBytes int64, r io.Reader) (int64, error) {
	return h.r.vm.PutFile(ctx, path, mode, maxBytes, r)
}

// GetFile copies the guest file at path into w, at most maxBytes.
func (h *Held) GetFile(ctx context.Context, path string, maxBytes int64, w io.WriterAt) (*agentproto.FileDone, error) {
	return h.r.vm.CopyOut(ctx, path, agentclient.CopyLimits{MaxSize: maxBytes, MaxData: maxBytes}, w)
}

// Expose relays connections accepted on ln to guestPort until ctx ends.
func (h *Held) Expose(ctx context.Context, guestPort int, ln net.Listener) error {
	return h.r.vm.Expose(ctx, guestPort, ln)
}

// Close kills the VMM and tears the VM down (in the background when the
// Service was told to; Service.Wait waits for it). Idempotent.
func (h *Held) Close() {
	h.once.Do(func() {
		h.r.stopCritical()
		h.r.s.teardown(h.r.cleanup)
	})
}
