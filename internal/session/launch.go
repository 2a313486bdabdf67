package session

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/errdefs"
	"isopod/internal/vmrecord"
)

// ReadyMargin is how long Launch waits for a supervisor beyond twice the
// VM's boot timeout (a wait for a VM place, then the boot).
const ReadyMargin = 30 * time.Second

// Launcher starts supervisors: Binary is the isopod CLI, which serves the
// hidden `session-supervisor` command, and Args are given to every
// supervisor after its own (a kernel override).
type Launcher struct {
	Binary string
	Args   []string
	// Env, when set, is the supervisor's environment (the front end's
	// settings spelled as variables); nil: this process's.
	Env []string
}

// Launch starts rec's supervisor detached (its own session, its output in
// supervisor.log) with extra arguments after the launcher's, and waits,
// bounded by twice the VM's boot timeout (the supervisor may wait that
// long for a VM place first) and ReadyMargin, for it to say the VM is
// ready. An interrupted wait ends the supervisor (and so its VM).
func (l Launcher) Launch(ctx context.Context, st Store, rec *Record, extra ...string) error {
	logPath := filepath.Join(st.SessionDir(rec.ID), "supervisor.log")
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("creating the supervisor's log: %w", err)
	}
	defer logf.Close()
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	defer pr.Close()
	args := append([]string{"session-supervisor", "--id", rec.ID, "--ready-fd", "3"}, l.Args...)
	cmd := exec.Command(l.Binary, append(args, extra...)...)
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = logf, logf, []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir, cmd.Env = "/", l.Env
	if err := cmd.Start(); err != nil {
		pw.Close()
		return fmt.Errorf("starting the session's supervisor: %w", err)
	}
	pw.Close()
	go cmd.Wait()
	bound := 2*time.Duration(max(rec.Spec.BootTimeoutS, 1))*time.Second + ReadyMargin
	pr.SetReadDeadline(time.Now().Add(bound))
	stop := context.AfterFunc(ctx, func() { pr.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	line, rerr := bufio.NewReader(pr).ReadBytes('\n')
	var a Answer
	if rerr != nil || json.Unmarshal(line, &a) != nil {
		cmd.Process.Kill()
		if ctx.Err() != nil {
			return fmt.Errorf("starting the session: %w", ctx.Err())
		}
		if errors.Is(rerr, os.ErrDeadlineExceeded) {
			return fmt.Errorf("the session's VM was not ready within %s; see %s: %w", bound, logPath, errdefs.ErrUnavailable)
		}
		return fmt.Errorf("the session's supervisor ended before its VM was ready; see %s: %w", logPath, errdefs.ErrUnavailable)
	}
	return a.Err()
}

// Call sends c to the live session ref names, within d (0: no bound
// beyond ctx), and returns its result. A session that is not live is
// failed_precondition, naming its state.
func (s Store) Call(ctx context.Context, ref string, c Call, d time.Duration) (json.RawMessage, error) {
	rec, err := s.Resolve(ref)
	if err != nil {
		return nil, err
	}
	if rec.State == StatePaused {
		return nil, fmt.Errorf("session %s is paused (%s): resume it first (isopod session resume): %w",
			rec.ID, rec.Reason, errdefs.ErrFailedPrecondition)
	}
	if !rec.Live() {
		return nil, fmt.Errorf("session %s is %s (%s): start a new one: %w",
			rec.ID, rec.State, rec.Reason, errdefs.ErrFailedPrecondition)
	}
	if d > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	return Dial(ctx, rec.Socket, c)
}

// WaitExit waits, at most d, for rec's supervisor to exit: a stop's answer
// comes when the VM is gone, and the supervisor exits right after it.
func WaitExit(rec *Record, d time.Duration) {
	fd, err := unix.PidfdOpen(rec.SupervisorPID, 0)
	if err != nil {
		return
	}
	defer unix.Close(fd)
	if !vmrecord.Alive(rec.SupervisorPID, rec.SupervisorStart) {
		return
	}
	fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	unix.Poll(fds, int(d.Milliseconds()))
}
