package cli

import (
	"bytes"
	"encoding/json"
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/sandbox"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// `isopod session pause|resume|fork`: a paused session's VM is on disk (its
// memory, device state and disks) and nothing runs for it; resume brings
// it back where it was. Every call but stop resumes a paused session
// first (callSession). A fork is a new session resumed from a copy of
// another's VM.

func newSessionPauseCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "pause ID|NAME",
		Short: "Write a session's VM (memory, processes, disks) to disk and end its VMM until a resume",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			rec, err := e.sessions().Resolve(args[0])
			if err != nil {
				return err
			}
			res, err := e.sessions().Call(cmd.Context(), rec.ID, session.Call{Op: session.OpPause}, 0)
			if err != nil {
				return err
			}
			// The answer comes once the VM is on disk; the supervisor
			// exits right after it.
			session.WaitExit(rec, 10*time.Second)
			e.result = res
			return nil
		},
	}
}

func newSessionResumeCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "resume ID|NAME",
		Short: "Bring a paused session back with its processes, files and jobs",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			l, err := e.launcher(cmd)
			if err != nil {
				return err
			}
			rec, err := l.Resume(cmd.Context(), e.sessions(), args[0])
			if err != nil {
				return err
			}
			e.result = rec.Summary()
			return nil
		},
	}
}

func newSessionForkCmd(e *env) *cobra.Command {
	var name string
	c := &cobra.Command{
		Use:   "fork ID|NAME [--name N]",
		Short: "Start a new session with a copy of a running or paused session's memory, processes and disks",
		Args:  positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			if name != "" {
				if err := session.CheckName(name); err != nil {
					return err
				}
			}
			l, err := e.launcher(cmd)
			if err != nil {
				return err
			}
			rec, err := l.Fork(cmd.Context(), e.sessions(), args[0], name)
			if err != nil {
				return err
			}
			e.result = rec.Summary()
			return nil
		},
	}
	c.Flags().StringVar(&name, "name", "", "a name for the new session, unique among live and paused ones (default: from its id)")
	return c
}

// markResumed adds "resumed": true after the "ok" field of a call's
// answer.
func markResumed(res json.RawMessage) json.RawMessage {
	const ok = `{"ok":true`
	if !bytes.HasPrefix(res, []byte(ok)) {
		return res
	}
	return append([]byte(ok+`,"resumed":true`), res[len(ok):]...)
}

// checkPaused marks lost, on disk too, each paused session of recs whose
// VMM, kernel, initramfs or agent changed since its pause.
func (e *env) checkPaused(cmd *cobra.Command, recs []*session.Record) error {
	var svc *sandbox.Service
	for _, r := range recs {
		if r.State != session.StatePaused {
			continue
		}
		if svc == nil {
			var err error
			if svc, err = e.service(); err != nil {
				return err
			}
		}
		if why := svc.PausedChanged(cmd.Context(), e.sessions().PauseDir(r.ID)); why != "" {
			supervisor.LosePaused(e.sessions(), r, why)
		}
	}
	return nil
}
