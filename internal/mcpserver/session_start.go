package mcpserver

import (
	"context"
	"errors"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/sandbox"
	sess "isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// SessionStartArgs is session_start's input: sandbox_run's VM arguments
// (the same schema, the same checks and defaults) and the session's own.
type SessionStartArgs struct {
	Stage      string            `json:"stage,omitempty"`
	Base       string            `json:"base,omitempty"`
	Network    *bool             `json:"network,omitempty"`
	AllowHosts *[]string         `json:"allow_hosts,omitempty"`
	AllowCIDRs *[]string         `json:"allow_cidrs,omitempty"`
	Inject     []string          `json:"inject,omitempty"`
	TimeoutS   int               `json:"timeout_s,omitempty"`
	VCPUs      int               `json:"vcpus,omitempty"`
	MemMiB     int               `json:"mem_mib,omitempty"`
	ScratchMiB int               `json:"scratch_mib,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Cwd        string            `json:"cwd,omitempty"`

	Workspace    string `json:"workspace,omitempty"`
	WorkspaceAll bool   `json:"workspace_all,omitempty"`

	Name         string `json:"name,omitempty" jsonschema:"a name for the session, unique among live sessions: 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not ss- (default: from its id). Other session tools take it in place of session_id"`
	IdleTimeoutS int    `json:"idle_timeout_s,omitempty" jsonschema:"seconds without a call after which idle_action is taken (default 600)"`
	MaxLifetimeS int    `json:"max_lifetime_s,omitempty" jsonschema:"seconds after its start at which the session is stopped, whatever it does (default 86400)"`
	IdleAction   string `json:"idle_action,omitempty" jsonschema:"what the idle timeout does: pause (the default: its memory is kept on disk and the next call resumes it) or stop (the VM and what it held are gone)"`
}

// sessionRunArgs are the arguments session_start shares with
// sandbox_run, whose schema entries it takes as they are.
var sessionRunArgs = []string{"stage", "base", "network", "allow_hosts", "allow_cidrs", "inject", "timeout_s",
	"vcpus", "mem_mib", "scratch_mib", "env", "cwd", "workspace", "workspace_all"}

// sessionStartSchema is session_start's schema: sandbox_run's entries for
// the shared arguments, said of a session where they differ.
func sessionStartSchema() *jsonschema.Schema {
	sc := inputSchema[SessionStartArgs]()
	run := runInputSchema()
	for _, name := range sessionRunArgs {
		p := *run.Properties[name]
		sc.Properties[name] = &p
	}
	sc.Properties["timeout_s"].Description = "seconds the VM may take to boot (default 120, at most 3600); each session_exec has its own timeout_s"
	sc.Properties["env"].Description = "environment variables for every session_exec of the session, as an object of NAME: value (an exec's env adds to them)"
	sc.Properties["cwd"].Description = "working directory of the session's execs inside the VM (default /root, or /workspace with workspace)"
	sc.Properties["workspace"].Description = "a HOST directory under the server's host-I/O root copied into the VM at /workspace once, at start (as sandbox_run's workspace); nothing reaches the host tree. At most 512 MiB and 100000 entries"
	for _, name := range []string{"idle_timeout_s", "max_lifetime_s"} {
		p := sc.Properties[name]
		p.Type, p.Types, p.Minimum = "integer", nil, floatp(1)
	}
	sc.Properties["idle_timeout_s"].Default = mustJSON(sess.DefaultIdleTimeoutS)
	sc.Properties["max_lifetime_s"].Default = mustJSON(sess.DefaultMaxLifetimeS)
	ia := sc.Properties["idle_action"]
	ia.Enum, ia.Default = []any{sess.IdlePause, sess.IdleStop}, mustJSON(sess.IdlePause)
	return sc
}

// sessionStart is the session_start handler: the request built and
// checked as sandbox_run's is, then the record (owned by the caller) and
// its supervisor, which answers once the VM is up.
func (s *Server) sessionStart(ctx context.Context, req *mcp.CallToolRequest, in SessionStartArgs) (*SessionSummary, error) {
	ctx, done := s.track(ctx)
	defer done()
	sc, err := s.sessions()
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	r, release, err := s.sessionRequest(in)
	defer release()
	if err == nil {
		err = sc.Check(ctx, r)
	}
	var spec sess.Spec
	if err == nil {
		spec, err = supervisor.SpecOf(r)
	}
	maxS := in.MaxLifetimeS
	if err == nil {
		maxS, err = sess.CapLifetime(maxS, maxS > 0, sc.MaxLifetimeS, "max_lifetime_s", sc.LifetimeSetting)
	}
	if err == nil {
		if in.IdleAction != "" {
			err = sess.CheckIdleAction(in.IdleAction)
		}
	}
	if err != nil {
		s.log.Info("tool refused", "tool", ToolSessionStart, "err", err)
		return nil, errors.New(refusalText(ToolSessionStart, err))
	}
	if sc.NoBinary != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, sc.NoBinary)
	}
	rec, err := sc.Store.Create(in.Name, spec, in.IdleTimeoutS, maxS)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	rec.IdleAction = in.IdleAction
	if err := sc.Store.Write(rec); err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	if err := setOwner(sc.Store, rec.ID, s.callerOf(req)); err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	stop := s.keepalive(ctx, req, newToolStatus(ToolSessionStart))
	defer stop()
	// Once up, the session outlives this call and this server; a start
	// interrupted (the call cancelled, the server stopping) ends it.
	if err := sc.Launcher.Launch(ctx, sc.Store, rec); err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	if rec, err = sc.Store.Load(rec.ID); err != nil {
		return nil, s.sessionError(ctx, ToolSessionStart, err)
	}
	return sessionSummary(rec), nil
}

// sessionRequest is session_start's VM request, built by sandbox_run's
// rules (buildRequest, openWorkspace) without a command.
func (s *Server) sessionRequest(in SessionStartArgs) (sandbox.Request, func(), error) {
	release := func() {}
	if in.Name != "" && sess.CheckName(in.Name) != nil {
		return sandbox.Request{}, release, &refusal{"name", fmt.Sprintf("%s: use 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not ss-", describe(in.Name))}
	}
	if in.IdleAction != "" && in.IdleAction != sess.IdleStop && in.IdleAction != sess.IdlePause {
		return sandbox.Request{}, release, &refusal{"idle_action", fmt.Sprintf("use stop or pause (got %s)", describe(in.IdleAction))}
	}
	ra := RunArgs{Cmd: "(session)", Stage: in.Stage, Base: in.Base, Network: in.Network, AllowHosts: in.AllowHosts,
		AllowCIDRs: in.AllowCIDRs, Inject: in.Inject, TimeoutS: in.TimeoutS, VCPUs: in.VCPUs, MemMiB: in.MemMiB,
		ScratchMiB: in.ScratchMiB, Env: in.Env, Cwd: in.Cwd, Workspace: in.Workspace, WorkspaceAll: in.WorkspaceAll}
	r, err := s.buildRequest(ra)
	if err != nil {
		return r, release, err
	}
	// A session has no command of its own: its execs do.
	r.Argv, r.Shell = nil, false
	// The check copies nothing but opens the directory the walk found;
	// the supervisor copies it by the path the walk resolved.
	release, err = s.openWorkspace(&r, ra)
	return r, release, err
}
