package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// readyMargin is how long `session start` waits for its supervisor beyond
// the VM's boot timeout.
const readyMargin = 30 * time.Second

// runOnlyFlags are run's flags that belong to its one command.
var runOnlyFlags = []string{"stdin-file", "copy-out", "copy-out-max-bytes", "commit-as", "workspace-out", "workspace-max-patch-bytes"}

func newSessionStartCmd(e *env) *cobra.Command {
	var o runOptions
	var name string
	var idleS, maxS int
	c := &cobra.Command{
		Use:   "start [flags]",
		Short: "Boot a VM that stays up for later execs (run's sizing, base, stage, network and workspace flags)",
		Args:  positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, f := range runOnlyFlags {
				if cmd.Flags().Changed(f) {
					return fmt.Errorf("--%s belongs to one command: give it to isopod session exec or cp instead: %w", f, errdefs.ErrInvalidArgument)
				}
			}
			if err := o.complete(cmd, nil); err != nil {
				return err
			}
			if idleS < 0 || maxS < 0 {
				return fmt.Errorf("--idle-timeout-s and --max-lifetime-s are positive seconds: %w", errdefs.ErrInvalidArgument)
			}
			if name != "" {
				if err := session.CheckName(name); err != nil {
					return err
				}
			}
			spec, err := specOf(o.req)
			if err != nil {
				return err
			}
			// What the supervisor would refuse is refused here, before
			// any record or process.
			svc, err := e.service()
			if err != nil {
				return err
			}
			if err := svc.CheckVM(cmd.Context(), o.req); err != nil {
				return raiseHint(err)
			}
			st := e.sessions()
			rec, err := st.Create(name, spec, idleS, maxS)
			if err != nil {
				return err
			}
			kernel, _ := cmd.Flags().GetString("kernel")
			if err := launch(cmd.Context(), st, rec, kernel); err != nil {
				// The record says why (stopped, or lost with a supervisor
				// that was killed); vm gc removes it.
				return err
			}
			rec, err = e.sessions().Load(rec.ID)
			if err != nil {
				return err
			}
			e.result = startResult{OK: true, SessionID: rec.ID, Name: rec.Name, State: rec.State, VMID: rec.VMID,
				Path: rec.Path, GuestIP: rec.GuestIP, IdleTimeoutS: rec.IdleTimeoutS, MaxLifetimeS: rec.MaxLifetimeS, Warnings: rec.Warnings}
			return nil
		},
	}
	runFlags(c, &o)
	for _, f := range runOnlyFlags {
		c.Flags().MarkHidden(f)
	}
	c.Flags().Lookup("timeout-s").Usage = "seconds the VM may take to boot: 1 to 3600"
	c.Flags().Lookup("env").Usage = "KEY=VALUE for every exec of the session; repeatable"
	c.Flags().Lookup("cwd").Usage = "working directory of the session's execs in the guest (default /root)"
	c.Flags().StringVar(&name, "name", "", "a name for the session, unique among live ones (default: from its id)")
	c.Flags().IntVar(&idleS, "idle-timeout-s", session.DefaultIdleTimeoutS, "stop the session after this many seconds without a call")
	c.Flags().IntVar(&maxS, "max-lifetime-s", session.DefaultMaxLifetimeS, "stop the session this many seconds after it started")
	return c
}

// startResult is what `session start` prints.
type startResult struct {
	OK           bool     `json:"ok"`
	SessionID    string   `json:"session_id"`
	Name         string   `json:"name"`
	State        string   `json:"state"`
	VMID         string   `json:"vm_id"`
	Path         string   `json:"path"`
	GuestIP      string   `json:"guest_ip,omitempty"`
	IdleTimeoutS int      `json:"idle_timeout_s"`
	MaxLifetimeS int      `json:"max_lifetime_s"`
	Warnings     []string `json:"warnings,omitempty"`
}

// specOf is what of req a session keeps, its workspace directory made
// absolute (the supervisor runs elsewhere).
func specOf(req sandbox.Request) (session.Spec, error) {
	sp := session.Spec{Stage: req.Stage, Base: req.Base, NoNetwork: req.NoNetwork, AllowLANEgress: req.AllowLANEgress,
		AllowHosts: req.AllowHosts, AllowCIDRs: req.AllowCIDRs, DenyEgress: req.DenyEgress, Inject: req.Inject,
		VCPUs: req.VCPUs, MemMiB: req.MemMiB, ScratchMiB: req.ScratchMiB, BootTimeoutS: req.TimeoutS,
		Env: req.Env, Cwd: req.Cwd}
	if w := req.Workspace; w != nil {
		abs, err := filepath.Abs(w.Host)
		if err != nil {
			return sp, fmt.Errorf("--workspace %s: %w: %w", w.Host, err, errdefs.ErrInvalidArgument)
		}
		sp.WorkspaceHost, sp.WorkspaceGuest = abs, w.Guest
		sp.WorkspaceAll, sp.WorkspaceMaxBytes, sp.WorkspaceMaxFiles = w.All, w.MaxBytes, w.MaxFiles
	}
	return sp, nil
}

// requestOf is the VM request of a session's spec.
func requestOf(sp session.Spec) sandbox.Request {
	req := sandbox.Request{Stage: sp.Stage, Base: sp.Base, NoNetwork: sp.NoNetwork, AllowLANEgress: sp.AllowLANEgress,
		AllowHosts: sp.AllowHosts, AllowCIDRs: sp.AllowCIDRs, DenyEgress: sp.DenyEgress, Inject: sp.Inject,
		VCPUs: sp.VCPUs, MemMiB: sp.MemMiB, ScratchMiB: sp.ScratchMiB, TimeoutS: sp.BootTimeoutS}
	if sp.WorkspaceHost != "" {
		w := &sandbox.Workspace{Host: sp.WorkspaceHost, Guest: sp.WorkspaceGuest}
		w.All, w.MaxBytes, w.MaxFiles = sp.WorkspaceAll, sp.WorkspaceMaxBytes, sp.WorkspaceMaxFiles
		w.Raise = func(what string) string { return capFlags[what] }
		req.Workspace = w
	}
	return req
}

// launch starts rec's supervisor detached (its own session, its output in
// supervisor.log) and waits, bounded, for it to say the VM is ready.
func launch(ctx context.Context, st session.Store, rec *session.Record, kernel string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding isopod's own binary: %w", err)
	}
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
	args := []string{"session-supervisor", "--id", rec.ID, "--ready-fd", "3"}
	if kernel != "" {
		args = append(args, "--kernel", kernel)
	}
	cmd := exec.Command(self, args...)
	cmd.Stdout, cmd.Stderr, cmd.ExtraFiles = logf, logf, []*os.File{pw}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if err := cmd.Start(); err != nil {
		pw.Close()
		return fmt.Errorf("starting the session's supervisor: %w", err)
	}
	pw.Close()
	go cmd.Wait()
	bound := time.Duration(max(rec.Spec.BootTimeoutS, 1))*time.Second + readyMargin
	pr.SetReadDeadline(time.Now().Add(bound))
	// An interrupted start ends its supervisor (and so its VM).
	stop := context.AfterFunc(ctx, func() { pr.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	line, rerr := bufio.NewReader(pr).ReadBytes('\n')
	var a session.Answer
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

// newSupervisorCmd is the hidden command `session start` runs detached.
func newSupervisorCmd(e *env) *cobra.Command {
	var id string
	var readyFD int
	c := &cobra.Command{
		Use:    "session-supervisor --id ID",
		Short:  "Own one session's VM (started by isopod session start)",
		Hidden: true,
		Args:   positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			st := e.sessions()
			rec, err := st.Read(id)
			if err != nil {
				return err
			}
			svc, err := e.service()
			if err != nil {
				return err
			}
			var ready *os.File
			if readyFD > 2 {
				ready = os.NewFile(uintptr(readyFD), "ready")
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
			defer stop()
			o := supervisor.Options{Service: svc, Store: st, ID: id, Request: requestOf(rec.Spec), Logger: e.log}
			if ready != nil {
				o.Ready = ready
			}
			if err := supervisor.Run(ctx, o); err != nil {
				return err
			}
			e.result = session.Reply{OK: true, SessionID: id}
			return nil
		},
	}
	c.Flags().StringVar(&id, "id", "", "the session's id")
	c.Flags().IntVar(&readyFD, "ready-fd", 0, "a descriptor that gets one line once the VM is ready")
	return c
}
