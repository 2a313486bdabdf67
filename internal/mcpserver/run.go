package mcpserver

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/admission"
	"isopod/internal/agentclient"
	"isopod/internal/credential"
	"isopod/internal/hostio"
	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// RunArgs is sandbox_run's input. Field descriptions are the schema a model
// reads, so they carry the semantics.
type RunArgs struct {
	Cmd   string `json:"cmd" jsonschema:"shell command to run inside the VM, as /bin/sh -c CMD; chain steps with && so a failing step makes the exit code non-zero; /bin/sh is dash on base-debian (no pipefail): for a pipeline whose failure must count, run it under bash -o pipefail -c"`
	Stage string `json:"stage,omitempty" jsonschema:"stage to fork: \"base\" (default) is the clean base; otherwise a label such as myproj/deps, a stage name or a stage_id from stage_list, or a prefix of one stage's label or of its stage_id (at least 4 hex digits, with or without st-). The stage itself is never modified"`
	Base  string `json:"base,omitempty" jsonschema:"base image when stage is \"base\": base-debian (default; python3/pip, node/npm, git, gcc, make, curl) or base-min (busybox only), or a base imported from a container image (it needs /bin/sh). A forked stage always uses the base it was made on; see image_list"`

	// The two lists are pointers so that absent (nil) and [] differ.
	Network    *bool     `json:"network,omitempty" jsonschema:"give the VM a network card (default true: NAT to public addresses, unless allow_hosts or allow_cidrs is given); false for untrusted code that needs no network (refused with allow_hosts or allow_cidrs)"`
	AllowHosts *[]string `json:"allow_hosts,omitempty" jsonschema:"switch to filtered, default-deny egress: only these host names are reachable (exact or *.suffix, e.g. [\"pypi.org\", \"*.pythonhosted.org\"]). Given at all, even as [], the run is filtered; with no rule in allow_hosts or allow_cidrs it denies everything but records every attempted connection and DNS lookup in the report's egress. Absent or null: no filtering from this argument"`
	AllowCIDRs *[]string `json:"allow_cidrs,omitempty" jsonschema:"switch to filtered, default-deny egress and allow these destination networks (e.g. [\"203.0.113.0/24\"]). Given at all, even as [], the run is filtered; with no rule in allow_hosts or allow_cidrs it denies everything and records every attempt. Absent or null: no filtering from this argument"`

	Inject []string `json:"inject,omitempty" jsonschema:"credential aliases the operator declared for MCP use (e.g. [\"github\"]): the host holds each secret and the VM never sees it; cmd calls $ISOPOD_CREDENTIAL_ENDPOINT/<alias>/<path> (plain http, e.g. curl -s $ISOPOD_CREDENTIAL_ENDPOINT/github/user) and the host makes the HTTPS request to the alias's one host with the secret added, if the operator's rules for the alias allow that method and path. Implies filtered egress (only allow_hosts and allow_cidrs besides); the alias's host is reachable only through the endpoint. Refused with network=false, and with one uniform message for an alias that is unknown, not enabled for MCP, or not usable on this host"`

	CommitAs string `json:"commit_as,omitempty" jsonschema:"save the VM's filesystem changes as a stage with this label, only when cmd exits 0. Use <project>/<purpose>, e.g. myproj/deps; fork it later with stage"`

	TimeoutS   int `json:"timeout_s,omitempty" jsonschema:"wall-clock limit in seconds for boot plus command (default 120, at most 3600); on expiry the report has timed_out true. A stage pulled from the server's stage registry first counts too"`
	VCPUs      int `json:"vcpus,omitempty" jsonschema:"virtual CPUs (default 1)"`
	MemMiB     int `json:"mem_mib,omitempty" jsonschema:"guest memory in MiB (default 512)"`
	ScratchMiB int `json:"scratch_mib,omitempty" jsonschema:"size in MiB of the writable layer (default 1024); raise it for big installs"`

	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables for cmd, as an object of NAME: value"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory inside the VM (default /root)"`
	Stdin     string            `json:"stdin,omitempty" jsonschema:"text fed to cmd's standard input"`
	StdinFile string            `json:"stdin_file,omitempty" jsonschema:"a HOST file fed to cmd's standard input instead of stdin: a regular file of at most 4 MiB under the server's host-I/O root (relative paths are taken from that root)"`
	CopyOut   []CopyOutArg      `json:"copy_out,omitempty" jsonschema:"files to copy from the VM to the HOST after cmd (skipped if it timed out); each host path must lie under the server's host-I/O root and is replaced atomically"`
	ReadFiles []string          `json:"read_files,omitempty" jsonschema:"absolute paths of files inside the VM whose contents come back in the result's files (after cmd, skipped if it timed out): text as it is, anything else base64; at most 16 files and 4 MiB in all (a file past that is cut, truncated true). The way to get results back without a host path"`

	Workspace    string `json:"workspace,omitempty" jsonschema:"a HOST directory under the server's host-I/O root (relative paths are taken from that root) copied into the VM at /workspace, which becomes the default cwd: in a git work tree what git would see (tracked and untracked, not ignored, files) and .git, credentials removed; the copy is writable and nothing reaches the host tree. At most 512 MiB and 100000 entries"`
	WorkspaceAll bool   `json:"workspace_all,omitempty" jsonschema:"copy everything under workspace, not only what git would see"`
	WorkspaceOut string `json:"workspace_out,omitempty" jsonschema:"a HOST file under the host-I/O root that receives, after cmd (skipped if it timed out), what cmd changed in the workspace as a git patch (git apply it to take the changes; at most 16 MiB); the report's workspace says what changed"`
}

// CopyOutArg names one guest file and its host destination.
type CopyOutArg struct {
	Guest string `json:"guest" jsonschema:"absolute path of a regular file inside the VM"`
	Host  string `json:"host" jsonschema:"destination on the HOST, under the server's host-I/O root (relative paths are taken from that root); an existing file there is replaced"`
}

const runDescription = `Run one shell command in a fresh, isolated microVM and destroy the VM afterwards. Returns one JSON report: exit_code (null if killed by a signal or timed out), signal, timed_out, stdout and stderr (first 64 KiB each, with *_truncated, exact *_bytes, and complete logs at *_log_path), timings in ms (total_ms, duration_ms for the command itself, boot_ms...), vm_id and vm_name, and stage_id/stage_name when commit_as committed (commit_error when the commit failed; the run still succeeded). A non-zero exit_code is a normal result, not a tool error.

Nothing persists except a stage saved with commit_as (only on exit 0) and files copied out with copy_out. workspace brings a host directory in (at /workspace, the default cwd) and workspace_out its changes back as a patch; the host tree is never modified. Fork a saved stage with stage. timeout_s covers boot and command together.

Network: on by default (NAT). network=false for untrusted code; allow_hosts or allow_cidrs, given at all (even []), switches to default-deny filtering (with no rule in either, everything is denied) and the report's egress lists what was allowed and denied. inject names credentials the host signs requests with through $ISOPOD_CREDENTIAL_ENDPOINT (filtered egress; the secret never enters the VM).

Base: base-debian unless base or a forked stage says otherwise; on a host where base-debian is not built, a run that names no base uses base-min and its warnings say how to build base-debian.`

// sandboxRun is the sandbox_run handler: refusals first, then a VM place
// (waiting in line if the host is full), the stage pulled if this host
// lacks it, the run, a commit pushed, read_files read back.
func (s *Server) sandboxRun(ctx context.Context, req *mcp.CallToolRequest, in RunArgs) (*RunResult, error) {
	s.countRun()
	ctx, done := s.track(ctx)
	defer done()
	if c := httpCallFrom(ctx); c != nil {
		// The call's HTTP request ending (or a cancellation naming it)
		// ends the run.
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer context.AfterFunc(c.ctx, cancel)()
	}
	r, release, rf, err := s.prepareRun(in)
	defer release()
	defer rf.release()
	if err != nil {
		// Nothing has started: whatever its class, this is a refusal.
		s.log.Info("tool refused", "tool", ToolSandboxRun, "err", err)
		return nil, errors.New(refusalText(ToolSandboxRun, err))
	}
	ticket, err := s.reserve(ctx, r.MemMiB)
	if err != nil {
		s.log.Info("tool refused", "tool", ToolSandboxRun, "err", err)
		return nil, errors.New(busyText(err))
	}
	if ticket != nil {
		defer ticket.Release()
	}
	st := newRunStatus()
	stop := s.keepalive(ctx, req, st)
	defer stop()
	rep, reg, err := s.runAdmitted(ctx, &r, ticket, st)
	if err != nil {
		return nil, s.toolError(ctx, failure{tool: ToolSandboxRun, stage: r.Stage, base: cmp.Or(r.Base, r.DefaultBase)}, rf.reword(err))
	}
	reg = s.pushCommit(ctx, rep, in.CommitAs, reg, st)
	stop()
	files, warns := rf.collect(rep)
	out := runResult(rep)
	out.Files, out.Registry = files, reg
	out.Warnings = append(out.Warnings, warns...)
	return out, nil
}

// prepareRun builds the core request, confining host paths and adding
// read_files' copies. release and rf.release undo what it opened.
func (s *Server) prepareRun(in RunArgs) (sandbox.Request, func(), *readFiles, error) {
	r, err := s.buildRequest(in)
	if err != nil {
		return r, func() {}, nil, err
	}
	release, err := s.openCopyOut(&r, in.CopyOut)
	if err != nil {
		return r, release, nil, err
	}
	wsRelease, err := s.openWorkspace(&r, in)
	if err != nil {
		release()
		return r, func() {}, nil, err
	}
	copyRelease := release
	release = func() { copyRelease(); wsRelease() }
	rf, err := prepareReadFiles(&r, in.ReadFiles)
	return r, release, rf, err
}

// runAdmitted pulls the stage when this host lacks it, waits for the
// call's VM place, and runs.
func (s *Server) runAdmitted(ctx context.Context, r *sandbox.Request, t *admission.Ticket, st *runStatus) (*report.Run, *RegistryResult, error) {
	reg, err := s.ensureStage(ctx, r, st)
	if err != nil {
		return nil, nil, err
	}
	if err := waitAdmitted(ctx, t, st, time.Duration(cmp.Or(r.TimeoutS, sandbox.DefaultTimeoutS))*time.Second); err != nil {
		return nil, reg, err
	}
	r.Place = t
	rep, err := s.cfg.Core.Run(ctx, *r)
	if err == nil && rep == nil {
		err = fmt.Errorf("the core returned no report")
	}
	return rep, reg, err
}

// inspectorArgs accepts what form-based clients (MCP Inspector) send for
// sandbox_run's boolean and array arguments: text. network "true" or
// "false" becomes the boolean; allow_hosts, allow_cidrs, copy_out,
// read_files and inject given as the JSON text of an array ("[]",
// "[\"pypi.org\"]") become that array; an empty string (or "null") for
// any of them means not given. Anything
// else is left for the checker to refuse.
func inspectorArgs(args map[string]any) {
	if v, ok := args["network"].(string); ok {
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "", "null":
			delete(args, "network")
		case "true":
			args["network"] = true
		case "false":
			args["network"] = false
		}
	}
	for _, name := range []string{"allow_hosts", "allow_cidrs", "copy_out", "read_files", "inject"} {
		v, ok := args[name].(string)
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		if v == "" || v == "null" {
			delete(args, name)
			continue
		}
		dec := json.NewDecoder(strings.NewReader(v))
		dec.UseNumber()
		var arr []any
		if strings.HasPrefix(v, "[") && dec.Decode(&arr) == nil && dec.InputOffset() == int64(len(v)) {
			args[name] = arr
		}
	}
}

// buildRequest maps sandbox_run's arguments to a core request. Host paths
// are confined here, before anything starts.
func (s *Server) buildRequest(in RunArgs) (sandbox.Request, error) {
	bad := func(path, format string, a ...any) error {
		return &refusal{path, fmt.Sprintf(format, a...)}
	}
	if strings.TrimSpace(in.Cmd) == "" {
		return sandbox.Request{}, bad("cmd", "empty; give the shell command to run, e.g. \"echo hi\"")
	}
	r := sandbox.Request{
		Argv:  []string{"/bin/sh", "-c", in.Cmd},
		Shell: true,
		Stage: in.Stage,
		Base:  in.Base,
		// The core applies it only to a run from the empty stage that
		// names no base: a fork boots the base its chain was made on.
		DefaultBase: DefaultBase,
		// Given at all, even as [], either list makes the run filtered
		// (the core denies everything when neither holds a rule): a list
		// keeps that given-ness as a non-nil slice.
		AllowHosts: given(in.AllowHosts),
		AllowCIDRs: given(in.AllowCIDRs),
		VCPUs:      in.VCPUs,
		MemMiB:     in.MemMiB,
		ScratchMiB: in.ScratchMiB,
		TimeoutS:   in.TimeoutS,
		Cwd:        in.Cwd,
		CommitAs:   in.CommitAs,
		// A model names the aliases: only those the store marks for MCP,
		// and one uniform refusal for any other.
		Inject: in.Inject,
		Caller: credential.Model,
	}
	if in.Network != nil && !*in.Network {
		if in.AllowHosts != nil || in.AllowCIDRs != nil {
			return sandbox.Request{}, bad("network", "false removes the network card, so allow_hosts and allow_cidrs cannot apply; drop one or the other")
		}
		if len(in.Inject) > 0 {
			return sandbox.Request{}, bad("inject", "needs the network: the VM reaches a credential through its gateway, and network=false removes the network card; drop one or the other")
		}
		r.NoNetwork = true
	}

	env, err := envPairs(in.Env)
	if err != nil {
		return sandbox.Request{}, err
	}
	r.Env = env

	if in.StdinFile != "" {
		if in.Stdin != "" {
			return sandbox.Request{}, bad("stdin_file", "stdin is given too; give one of them")
		}
		data, _, err := s.cfg.HostIO.ReadStdinFile(in.StdinFile)
		if err != nil {
			return sandbox.Request{}, err
		}
		r.Stdin = bytes.NewReader(data)
	} else if in.Stdin != "" {
		if len(in.Stdin) > hostio.MaxStdinFileBytes {
			return sandbox.Request{}, bad("stdin", "is %d bytes; at most %d (4 MiB): copy larger inputs in through a stage or the network", len(in.Stdin), hostio.MaxStdinFileBytes)
		}
		r.Stdin = strings.NewReader(in.Stdin)
	}

	return r, nil
}

// envPairs is an env argument as NAME=value pairs, sorted by name.
func envPairs(env map[string]string) ([]string, error) {
	keys := make([]string, 0, len(env))
	for k := range env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var out []string
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return nil, &refusal{"env", fmt.Sprintf("the name %s is invalid: names must be non-empty and contain no '=' or NUL", describe(k))}
		}
		out = append(out, k+"="+env[k])
	}
	return out, nil
}

// given is a list argument as the core takes it: nil when absent, and
// non-nil, even empty, when given.
func given(l *[]string) []string {
	if l == nil {
		return nil
	}
	return append([]string{}, *l...)
}

// openCopyOut confines copy_out's host destinations: all are checked
// first (a refused call creates nothing), then each is opened beneath the
// root, its missing parents created there, and handed to the core as its
// parent directory's descriptor. release closes them once the run is over.
func (s *Server) openCopyOut(r *sandbox.Request, cos []CopyOutArg) (release func(), err error) {
	for i, c := range cos {
		if !strings.HasPrefix(c.Guest, "/") {
			return func() {}, &refusal{fmt.Sprintf("copy_out[%d].guest", i), fmt.Sprintf("give the file's absolute path inside the VM (got %s)", describe(c.Guest))}
		}
		if err := agentclient.CheckGuestPath(fmt.Sprintf("copy_out[%d].guest", i), c.Guest); err != nil {
			return func() {}, err
		}
		if _, err := s.cfg.HostIO.ResolveCopyOut(c.Host); err != nil {
			return func() {}, fmt.Errorf("copy_out[%d]: %w", i, err)
		}
	}
	var dirs []*os.File
	release = func() {
		for _, d := range dirs {
			d.Close()
		}
	}
	for i, c := range cos {
		path, dir, err := s.cfg.HostIO.OpenCopyOut(c.Host)
		if err != nil {
			release()
			return func() {}, fmt.Errorf("copy_out[%d]: %w", i, err)
		}
		dirs = append(dirs, dir)
		r.CopyOut = append(r.CopyOut, sandbox.CopyOut{Guest: c.Guest, Host: path, HostDir: dir})
	}
	return release, nil
}
