package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"regexp"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"isopod/internal/machine"
	"isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// `isopod session`: a VM that outlives the call that started it, owned by
// a supervisor process (internal/session). Hidden for now.

func (e *env) sessions() session.Store { return session.Store{Paths: e.settings.Paths} }

// callMargin bounds a call beyond the guest-side time it asks for.
const callMargin = 60 * time.Second

func newSessionCmd(e *env) *cobra.Command {
	c := group("session", "VMs that stay up across calls: start, exec, cp, expose, pause, resume, fork, commit, stop",
		newSessionStartCmd(e), newSessionExecCmd(e), newSessionJobCmd(e), newSessionJobsCmd(e),
		newSessionCpCmd(e), newSessionExposeCmd(e), newSessionCommitCmd(e), newSessionStopCmd(e), newSessionLsCmd(e),
		newSessionPauseCmd(e), newSessionResumeCmd(e), newSessionForkCmd(e))
	return c
}

// callSession sends c to the session ref names, within d (0: no bound),
// resuming it first when it is paused, and keeps its answer as the
// command's result (with "resumed": true when it resumed it).
func (e *env) callSession(cmd *cobra.Command, ref string, c session.Call, d time.Duration) (json.RawMessage, error) {
	var res json.RawMessage
	var err error
	resumed := false
	if c.Op == session.OpStop {
		res, err = e.sessions().Call(cmd.Context(), ref, c, d)
	} else {
		l, lerr := e.launcher(cmd)
		if lerr != nil {
			return nil, lerr
		}
		res, resumed, err = l.CallWake(cmd.Context(), e.sessions(), ref, c, d)
	}
	if err != nil {
		return nil, err
	}
	if resumed {
		res = markResumed(res)
	}
	e.result = res
	return res, nil
}

func newSessionExecCmd(e *env) *cobra.Command {
	var c session.Call
	var stdinFile string
	var copyOuts []string
	cmd := &cobra.Command{
		Use:   "exec ID|NAME [flags] -- ARGV...",
		Short: "Run a command in a session (what it leaves running stays); --detach starts a background job",
		Args:  positional(cobra.MinimumNArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c.Op, c.Argv = session.OpExec, args[1:]
			if c.Shell && len(c.Argv) != 1 {
				return fmt.Errorf("--shell takes one command line: quote it: %w", errdefs.ErrInvalidArgument)
			}
			if stdinFile != "" {
				f, err := hostio.Operator{}.OpenStdinFile(stdinFile)
				if err != nil {
					return err
				}
				defer f.Close()
				if c.Stdin, err = readCapped(f, "--stdin-file"); err != nil {
					return err
				}
			}
			pairs, err := copyOutPairs(copyOuts, c.Detach)
			if err != nil {
				return err
			}
			res, err := e.callSession(cmd, args[0], c, time.Duration(max(c.TimeoutS, 120))*time.Second+callMargin)
			if err != nil || len(pairs) == 0 {
				return err
			}
			return e.execCopyOuts(cmd, args[0], res, pairs)
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&copyOuts, "copy-out", nil, "GUEST:HOST: after the command (unless it timed out), copy a guest file to the host as run's --copy-out does (at most 64 MiB each); repeatable")
	f.IntVar(&c.TimeoutS, "timeout-s", 120, "seconds before the guest kills the command: 1 to 3600 (a detached job: none unless set)")
	f.StringArrayVar(&c.Env, "env", nil, "KEY=VALUE for the command; repeatable")
	f.StringVar(&c.Cwd, "cwd", "", "working directory in the guest (default: the session's)")
	f.StringVar(&stdinFile, "stdin-file", "", "feed the command's stdin from this host file (at most 64 MiB)")
	f.BoolVar(&c.Detach, "detach", false, "start a background job and print its job_id (see isopod session job)")
	f.BoolVar(&c.Shell, "shell", false, "ARGV is one shell command line for /bin/sh -c")
	return cmd
}

// copyOutPairs checks exec's --copy-out values before anything runs: each
// GUEST:HOST with an absolute guest path and a host destination that can
// be written.
func copyOutPairs(vals []string, detach bool) ([][2]string, error) {
	if detach && len(vals) > 0 {
		return nil, fmt.Errorf("--copy-out copies after the command, which --detach does not wait for: copy with isopod session cp once the job ended: %w", errdefs.ErrInvalidArgument)
	}
	var pairs [][2]string
	for _, v := range vals {
		g, h, ok := strings.Cut(v, ":")
		if !ok || !strings.HasPrefix(g, "/") || h == "" {
			return nil, fmt.Errorf("--copy-out %q: want GUEST:HOST with an absolute guest path: %w", v, errdefs.ErrInvalidArgument)
		}
		if err := (hostio.Operator{}).CheckCopyOut("--copy-out", h); err != nil {
			return nil, err
		}
		pairs = append(pairs, [2]string{g, h})
	}
	return pairs, nil
}

// execCopyOuts copies an exec's --copy-out files once it ended (not when
// it timed out), and adds them to its report as copy_out.
func (e *env) execCopyOuts(cmd *cobra.Command, ref string, res json.RawMessage, pairs [][2]string) error {
	var rep struct {
		TimedOut bool `json:"timed_out"`
	}
	if err := json.Unmarshal(res, &rep); err != nil {
		return fmt.Errorf("reading the exec's report: %w", err)
	}
	if rep.TimedOut {
		e.result = res
		return nil
	}
	copies := []copiedOut{}
	for _, p := range pairs {
		c, err := e.copyOut(cmd, ref, p[0], p[1])
		if err != nil {
			return fmt.Errorf("--copy-out %s:%s (the command ran): %w", p[0], p[1], err)
		}
		copies = append(copies, c)
	}
	b, _ := json.Marshal(copies)
	body := bytes.TrimRight(res, " \n")
	e.result = json.RawMessage(append(append(append(body[:len(body)-1:len(body)-1], []byte(`,"copy_out":`)...), b...), '}'))
	return nil
}

// readCapped reads r whole, refusing more than session.MaxFileBytes.
func readCapped(r io.Reader, what string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, session.MaxFileBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", what, err)
	}
	if len(b) > session.MaxFileBytes {
		return nil, fmt.Errorf("%s is over %d MiB: copy it in pieces: %w", what, session.MaxFileBytes>>20, errdefs.ErrInvalidArgument)
	}
	return b, nil
}

func newSessionJobCmd(e *env) *cobra.Command {
	var c session.Call
	cmd := &cobra.Command{
		Use:   "job ID|NAME JOB",
		Short: "Read a background job's new output and state; --wait-s waits for its end, --kill ends it",
		Args:  positional(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			c.Op, c.Job = session.OpJob, args[1]
			_, err := e.callSession(cmd, args[0], c, time.Duration(c.WaitS)*time.Second+callMargin)
			return err
		},
	}
	cmd.Flags().IntVar(&c.WaitS, "wait-s", 0, "wait up to this many seconds for the job to end")
	cmd.Flags().BoolVar(&c.Kill, "kill", false, "kill the job's process group (SIGKILL)")
	return cmd
}

func newSessionJobsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use: "jobs ID|NAME", Short: "List a session's background jobs", Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, err := e.callSession(cmd, args[0], session.Call{Op: session.OpJobs}, callMargin)
			return err
		},
	}
}

// guestSide matches ID|NAME:/path.
var guestSide = regexp.MustCompile(`^([a-z0-9][a-z0-9._-]*):(/.*)$`)

func newSessionCpCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy a file into or out of a session: one side is ID|NAME:/guest/path (at most 64 MiB)",
		Args:  positional(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := guestSide.FindStringSubmatch(args[0]), guestSide.FindStringSubmatch(args[1])
			switch {
			case src == nil && dst != nil:
				return e.copyIn(cmd, args[0], dst[1], dst[2])
			case src != nil && dst == nil:
				c, err := e.copyOut(cmd, src[1], src[2], args[1])
				if err == nil {
					e.result = struct {
						OK bool `json:"ok"`
						copiedOut
					}{true, c}
				}
				return err
			}
			return fmt.Errorf("cp %s %s: exactly one side must be ID|NAME:/guest/path: %w", args[0], args[1], errdefs.ErrInvalidArgument)
		},
	}
}

func (e *env) copyIn(cmd *cobra.Command, host, ref, guest string) error {
	f, err := hostio.Operator{}.OpenStdinFile(host)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	data, err := readCapped(f, host)
	if err != nil {
		return err
	}
	_, err = e.callSession(cmd, ref, session.Call{Op: session.OpPut, Path: guest, Mode: uint32(fi.Mode().Perm()), Data: data}, callMargin)
	return err
}

// copiedOut is one copy of a guest file to the host.
type copiedOut struct {
	Guest string `json:"guest"`
	Host  string `json:"host"`
	Bytes int    `json:"bytes"`
}

// copyOut writes a guest file to host under run's copy-out rules: the
// destination's directory is opened and checked first; a regular file is
// written beside it and renamed into place, a character device or FIFO
// written through, never replaced.
func (e *env) copyOut(cmd *cobra.Command, ref, guest, host string) (copiedOut, error) {
	out := copiedOut{Guest: guest, Host: host}
	dir, err := hostio.Operator{}.OpenCopyOut("cp", host)
	if err != nil {
		return out, err
	}
	defer dir.Close()
	res, err := e.callSession(cmd, ref, session.Call{Op: session.OpGet, Path: guest}, callMargin)
	if err != nil {
		return out, err
	}
	var got supervisor.GetResult
	if err := json.Unmarshal(res, &got); err != nil {
		return out, fmt.Errorf("reading the supervisor's answer: %w", err)
	}
	mode := fs.FileMode(got.Mode).Perm()
	if mode == 0 {
		mode = 0o644
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), callMargin)
	defer cancel()
	d, err := machine.Stage(ctx, machine.GetFile{Guest: guest, Host: host, HostDir: dir})
	if err != nil {
		return out, err
	}
	if _, err := d.WriteAt(got.Data, 0); err != nil {
		d.Abort()
		return out, fmt.Errorf("writing %s: %w", host, err)
	}
	if err := d.Commit(int64(len(got.Data)), mode); err != nil {
		return out, fmt.Errorf("writing %s: %w", host, err)
	}
	out.Bytes = len(got.Data)
	return out, nil
}

func newSessionExposeCmd(e *env) *cobra.Command {
	var hostPort int
	cmd := &cobra.Command{
		Use:   "expose ID|NAME PORT",
		Short: "Relay a host port on 127.0.0.1 to a guest TCP port, for the session's life (no network needed)",
		Args:  positional(cobra.ExactArgs(2)),
		RunE: func(cmd *cobra.Command, args []string) error {
			var port int
			if _, err := fmt.Sscanf(args[1], "%d", &port); err != nil || fmt.Sprint(port) != args[1] {
				return fmt.Errorf("port %q: want a number 1..65535: %w", args[1], errdefs.ErrInvalidArgument)
			}
			_, err := e.callSession(cmd, args[0], session.Call{Op: session.OpExpose, GuestPort: port, HostPort: hostPort}, callMargin)
			return err
		},
	}
	cmd.Flags().IntVar(&hostPort, "host-port", 0, "the host port (default: any free one)")
	return cmd
}

func newSessionStopCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use: "stop ID|NAME", Short: "Stop a session's VM and report its lifetime", Args: positional(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			rec, err := e.sessions().Resolve(args[0])
			if err != nil {
				return err
			}
			if rec.State == session.StatePaused {
				// Nothing runs: what the pause kept goes.
				fin, err := supervisor.StopPaused(e.sessions(), rec)
				e.result = fin
				return err
			}
			if _, err := e.callSession(cmd, rec.ID, session.Call{Op: session.OpStop}, callMargin); err != nil {
				return err
			}
			// The VM is gone when the answer comes; the supervisor
			// exits right after it.
			session.WaitExit(rec, 10*time.Second)
			return nil
		},
	}
}

func newSessionLsCmd(e *env) *cobra.Command {
	return &cobra.Command{
		Use: "ls", Short: "List sessions with the memory and disk each holds (a running one whose supervisor is gone reads lost)", Args: positional(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			recs := e.sessions().List()
			if err := e.checkPaused(cmd, recs); err != nil {
				return err
			}
			e.result = e.sessionList(recs)
			return nil
		},
	}
}
