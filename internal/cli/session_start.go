package cli

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/errdefs"
	"isopod/internal/knobs"
	"isopod/internal/ledger"
	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// runOnlyFlags are run's flags that belong to its one command.
var runOnlyFlags = []string{"stdin-file", "copy-out", "copy-out-max-bytes", "commit-as", "workspace-out", "workspace-max-patch-bytes"}

func newSessionStartCmd(e *env) *cobra.Command {
	var o runOptions
	var name string
	var idleS, maxS int
	var idleAction string
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
			err := o.complete(cmd, nil)
			if err != nil {
				return err
			}
			if maxS, err = e.checkStart(cmd, idleS, maxS, idleAction, name); err != nil {
				return err
			}
			spec, err := supervisor.SpecOf(o.req)
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
			if idleAction != session.IdlePause {
				rec.IdleAction = idleAction
				if err := st.Write(rec); err != nil {
					return err
				}
			}
			l, err := e.launcher(cmd)
			if err != nil {
				return err
			}
			if err := l.Launch(cmd.Context(), st, rec); err != nil {
				// The record says why (stopped, or lost with a supervisor
				// that was killed); vm gc removes it.
				return err
			}
			rec, err = e.sessions().Load(rec.ID)
			if err != nil {
				return err
			}
			e.result = rec.Summary()
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
	c.Flags().IntVar(&idleS, "idle-timeout-s", session.DefaultIdleTimeoutS, "pause (or stop: --idle-action) the session after this many seconds without a call")
	c.Flags().StringVar(&idleAction, "idle-action", session.IdlePause, "what the idle timeout does: pause (a later call resumes it) or stop")
	c.Flags().IntVar(&maxS, "max-lifetime-s", session.DefaultMaxLifetimeS, "stop the session this many seconds after it started")
	return c
}

// checkStart refuses session start's own flags that can never work and
// returns the maximum lifetime under this host's cap.
func (e *env) checkStart(cmd *cobra.Command, idleS, maxS int, idleAction, name string) (int, error) {
	if idleS < 0 || maxS < 0 {
		return 0, fmt.Errorf("--idle-timeout-s and --max-lifetime-s are positive seconds: %w", errdefs.ErrInvalidArgument)
	}
	maxS, err := session.CapLifetime(maxS, cmd.Flags().Changed("max-lifetime-s"), e.settings.SessionMaxLifetimeS, "--max-lifetime-s", knobs.SessionMaxLifetimeS)
	if err != nil {
		return 0, err
	}
	if err := session.CheckIdleAction(idleAction); err != nil {
		return 0, err
	}
	if name != "" {
		if err := session.CheckName(name); err != nil {
			return 0, err
		}
	}
	return maxS, nil
}

// newSupervisorCmd is the hidden command `session start` runs detached.
func newSupervisorCmd(e *env) *cobra.Command {
	var id string
	var readyFD int
	var resume bool
	var forkFrom string
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
			o := supervisor.Options{Service: svc, Store: st, ID: id, Request: supervisor.RequestOf(rec.Spec, func(what string) string { return capFlags[what] }), Logger: e.log,
				Resume: resume, ForkFrom: forkFrom, DiskBudget: e.settings.SessionDiskBudget, BudgetSetting: knobs.SessionDiskBudgetMiB}
			// The session's VM holds a place among the host's while it
			// runs; a start waits for one at most its boot timeout.
			o.Place = func(ctx context.Context) (func(), error) {
				return e.place(ctx, ledger.KindSession, id, o.Request.MemMiB, time.Duration(cmp.Or(o.Request.TimeoutS, sandbox.DefaultTimeoutS))*time.Second)
			}
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
	c.Flags().BoolVar(&resume, "resume", false, "restore the paused session's VM from its pause instead of starting it")
	c.Flags().StringVar(&forkFrom, "fork-from", "", "with --resume: first copy this session's VM into the pause (a fork)")
	return c
}

// launcher starts supervisors with this binary and its --kernel.
func (e *env) launcher(cmd *cobra.Command) (session.Launcher, error) {
	self, err := os.Executable()
	if err != nil {
		return session.Launcher{}, fmt.Errorf("finding isopod's own binary: %w", err)
	}
	l := session.Launcher{Binary: self}
	if kernel, _ := cmd.Flags().GetString("kernel"); kernel != "" {
		l.Args = []string{"--kernel", kernel}
	}
	return l, nil
}
