package cli

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"isopod/internal/ledger"
	"isopod/internal/sandbox"
	"isopod/internal/workspace"
)

func newRunCmd(e *env) *cobra.Command {
	var o runOptions
	c := &cobra.Command{
		Use:   "run [flags] -- ARGV...",
		Short: "Boot a fresh microVM, run one command, report, destroy the VM",
		Long: `Boot a fresh microVM, run ARGV in it (no shell: use sh -c for one),
and print one JSON report. A non-zero exit of the command is reported, not an
isopod failure. --commit-as keeps the run's filesystem changes as a stage when
the command exits 0. --inject ALIAS lets the command use a credential the host
holds, through $ISOPOD_CREDENTIAL_ENDPOINT (docs/credentials.md). The VM
takes one of the host's VM places (ISOPOD_MAX_VMS, ISOPOD_MEMORY_BUDGET_MIB),
shared with every isopod process under the state root: while they are all
held the run waits, saying so on stderr, at most --timeout-s, then fails as
busy (unavailable).`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return fmt.Errorf("no command: put it after --, e.g. isopod run -- echo hi: %w", errdefs.ErrInvalidArgument)
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.complete(cmd, args); err != nil {
				return err
			}
			svc, err := e.service()
			if err != nil {
				return err
			}
			release, err := o.openHostFiles()
			if err != nil {
				return err
			}
			defer release()
			// Once the request is checked, the run waits for a place at
			// most its own timeout, and holds it until its VM is cleaned
			// up.
			o.req.WaitPlace = func(ctx context.Context) error {
				_, err := e.place(ctx, ledger.KindRun, "", o.req.MemMiB, time.Duration(o.req.TimeoutS)*time.Second)
				return err
			}
			rep, err := svc.Run(cmd.Context(), o.req)
			if err != nil {
				return raiseHint(err)
			}
			e.result = rep
			return nil
		},
	}
	runFlags(c, &o)
	return c
}

// runOptions is what the flags of `isopod run` set: most bind straight to
// the request; complete parses the rest into it.
type runOptions struct {
	req       sandbox.Request
	stdinFile string
	copyOut   []string
	ws        workspace.Request
	wsSpec    string
}

// complete checks the flags and finishes o.req with the command args, the
// copy-outs, stdin and the workspace.
func (o *runOptions) complete(cmd *cobra.Command, args []string) error {
	o.req.Argv = args
	// Zero means "default" to the core; on the command line it is
	// a value, and out of range: refuse it naming the limits.
	for _, name := range []string{"vcpus", "mem-mib", "scratch-mib", "timeout-s"} {
		if fl := cmd.Flags().Lookup(name); fl.Changed && fl.Value.String() == "0" {
			return sandbox.CheckSize(strings.ReplaceAll(name, "-", "_"), 0)
		}
	}
	if fl := cmd.Flags().Lookup("copy-out-max-bytes"); fl.Changed && !positive(fl.Value.String()) {
		return fmt.Errorf("--copy-out-max-bytes %s: must be a positive number of bytes: %w", fl.Value, errdefs.ErrInvalidArgument)
	}
	for _, m := range o.copyOut {
		g, h, ok := strings.Cut(m, ":")
		if !ok || g == "" || h == "" {
			return fmt.Errorf("--copy-out %q: want GUEST:HOST: %w", m, errdefs.ErrInvalidArgument)
		}
		o.req.CopyOut = append(o.req.CopyOut, sandbox.CopyOut{Guest: g, Host: h})
	}
	switch o.stdinFile {
	case "":
	case "-":
		o.req.Stdin = os.Stdin
	}
	return workspaceFlags(cmd, &o.req, o.ws, o.wsSpec)
}

// openHostFiles opens the run's host files through the operator's policy
// (internal/hostio), before any VM starts: each copy-out destination's
// directory, the workspace patch's, and the stdin file. The core stages
// and renames the copies in the directories opened, as it does for the
// MCP server's. release closes them once the run is over.
func (o *runOptions) openHostFiles() (release func(), err error) {
	var opened []*os.File
	release = func() {
		for _, f := range opened {
			f.Close()
		}
	}
	fail := func(err error) (func(), error) {
		release()
		return func() {}, err
	}
	op := hostio.Operator{}
	for i := range o.req.CopyOut {
		c := &o.req.CopyOut[i]
		dir, err := op.OpenCopyOut("copy-out", c.Host)
		if err != nil {
			return fail(err)
		}
		c.HostDir, opened = dir, append(opened, dir)
	}
	if w := o.req.Workspace; w != nil && w.Out != "" {
		dir, err := op.OpenCopyOut("workspace-out", w.Out)
		if err != nil {
			return fail(err)
		}
		w.OutDir, opened = dir, append(opened, dir)
	}
	if o.stdinFile != "" && o.stdinFile != "-" {
		f, err := op.OpenStdinFile(o.stdinFile)
		if err != nil {
			return fail(err)
		}
		o.req.Stdin, opened = f, append(opened, f)
	}
	return release, nil
}

// runFlags registers the flags of `isopod run` on c, bound to o.
func runFlags(c *cobra.Command, o *runOptions) {
	req, ws := &o.req, &o.ws
	f := c.Flags()
	f.StringVar(&req.Stage, "stage", sandbox.BaseStage, "stage to fork: id, name or label, or a unique prefix of a label or of an id (6 or more hex digits, st- optional); base is the empty stage")
	f.StringVar(&req.Base, "base", "", "base image: base-min (default), base-debian or an imported one (isopod image ls); a fork keeps its chain's base")
	f.BoolVar(&req.NoNetwork, "no-network", false, "attach no network interface at all")
	f.BoolVar(&req.AllowLANEgress, "allow-lan-egress", false, "let the guest reach private (RFC1918, CGNAT, ULA) addresses; insecure")
	f.StringArrayVar(&req.AllowHosts, "allow-host", nil, "filtered egress: allow this host name (exact, or *.one-label wildcard); repeatable")
	f.StringArrayVar(&req.AllowCIDRs, "allow-cidr", nil, "filtered egress: allow this address range; repeatable")
	f.BoolVar(&req.DenyEgress, "deny-egress", false, "filtered egress that allows nothing but records every attempt")
	f.StringArrayVar(&req.Inject, "inject", nil, "credential ALIAS of $ISOPOD_HOME/credentials.json: the guest calls $ISOPOD_CREDENTIAL_ENDPOINT/ALIAS/PATH and the host adds the secret, which never enters the guest; implies filtered egress; repeatable")
	f.IntVar(&req.VCPUs, "vcpus", sandbox.DefaultVCPUs, "virtual CPUs: 1 or even, at most min(host CPUs, 32)")
	f.IntVar(&req.MemMiB, "mem-mib", sandbox.DefaultMemMiB, "guest memory in MiB: 128 to min(MemTotal-512, 4096)")
	f.IntVar(&req.ScratchMiB, "scratch-mib", 0, "size of the writable scratch disk in MiB (sparse): 128 to 65536; default 1024")
	f.IntVar(&req.TimeoutS, "timeout-s", sandbox.DefaultTimeoutS, "seconds for boot and command together: 1 to 3600")
	f.StringArrayVar(&req.Env, "env", nil, "KEY=VALUE for the command; repeatable")
	f.StringVar(&req.Cwd, "cwd", "", "working directory in the guest (default /root)")
	f.StringVar(&o.stdinFile, "stdin-file", "", "feed the command's stdin from this host file; - for isopod's own stdin")
	f.StringArrayVar(&o.copyOut, "copy-out", nil, "GUEST:HOST: after the command, copy a guest file to the host; repeatable")
	f.Int64Var(&req.CopyOutMaxData, "copy-out-max-bytes", sandbox.DefaultCopyOutMaxData, "cap on the data all copy-outs write to the host (holes are free)")
	f.StringVar(&req.CommitAs, "commit-as", "", "when the command exits 0, keep the run's changes as a stage with this label (never the workspace)")
	f.StringVar(&o.wsSpec, "workspace", "", "HOSTDIR[:GUESTDIR]: a writable copy of a host directory in the guest (default "+workspace.DefaultGuestDir+", then the default --cwd); in git, what git sees and .git")
	f.BoolVar(&ws.All, "workspace-all", false, "copy everything under the workspace directory, not only what git sees")
	f.StringVar(&ws.Out, "workspace-out", "", "after the command, write what it changed in the workspace to this host file as a patch for git apply")
	f.Int64Var(&ws.MaxBytes, "workspace-max-bytes", workspace.DefaultMaxBytes, "cap on the bytes of the workspace's files, .git included")
	f.IntVar(&ws.MaxFiles, "workspace-max-files", workspace.DefaultMaxFiles, "cap on the workspace's entries (files, directories, links)")
	f.Int64Var(&ws.MaxPatchBytes, "workspace-max-patch-bytes", workspace.DefaultMaxPatchBytes, "cap on the workspace patch and the changed content it carries")
}
