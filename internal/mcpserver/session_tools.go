package mcpserver

import (
	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	sess "isopod/internal/session"
)

// SessionRefArgs names one session.
type SessionRefArgs struct {
	SessionID string `json:"session_id" jsonschema:"the session: its session_id (ss-...) or its name"`
}

// SessionJobArgs configures session_job.
type SessionJobArgs struct {
	SessionID string `json:"session_id" jsonschema:"the session: its session_id (ss-...) or its name"`
	JobID     string `json:"job_id" jsonschema:"the job_id a background session_exec answered"`
	WaitS     int    `json:"wait_s,omitempty" jsonschema:"wait up to this many seconds for the job to end (default 0: answer at once)"`
	Kill      bool   `json:"kill,omitempty" jsonschema:"kill the job's process group (SIGKILL) and report how it ended"`
}

// SessionExposeArgs configures session_expose.
type SessionExposeArgs struct {
	SessionID string `json:"session_id" jsonschema:"the session: its session_id (ss-...) or its name"`
	GuestPort int    `json:"guest_port" jsonschema:"the TCP port a server listens on inside the VM"`
	HostPort  int    `json:"host_port,omitempty" jsonschema:"the port on the server host's 127.0.0.1 (default: any free one)"`
}

// SessionForkArgs configures session_fork.
type SessionForkArgs struct {
	SessionID string `json:"session_id" jsonschema:"the session to fork: its session_id (ss-...) or its name"`
	Name      string `json:"name,omitempty" jsonschema:"a name for the new session (default: from its id)"`
}

// SessionCommitArgs configures session_commit.
type SessionCommitArgs struct {
	SessionID string `json:"session_id" jsonschema:"the session: its session_id (ss-...) or its name"`
	Label     string `json:"label" jsonschema:"the stage's label, <project>/<purpose> (e.g. myproj/deps); sandbox_run and session_start fork it with stage"`
}

// SessionJobResult is session_job's result.
type SessionJobResult struct {
	SessionID string `json:"session_id"`
	Job       any    `json:"job"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
}

// SessionExposeResult is session_expose's result.
type SessionExposeResult struct {
	SessionID string `json:"session_id"`
	GuestPort int    `json:"guest_port"`
	Address   string `json:"address"`
}

// SessionStopResult is session_stop's result.
type SessionStopResult struct {
	SessionID string  `json:"session_id"`
	Name      string  `json:"name"`
	State     string  `json:"state"`
	Reason    string  `json:"reason,omitempty"`
	VMID      string  `json:"vm_id"`
	LifetimeS float64 `json:"lifetime_s"`
	Execs     int     `json:"execs"`
}

// SessionCommitResult is session_commit's result: the supervisor's
// answer (the stage it made), whole.
type SessionCommitResult struct {
	SessionID string `json:"session_id"`
	Label     string `json:"label"`
	Stage     any    `json:"stage"`
}

// SessionEntry is one session in session_list.
type SessionEntry struct {
	SessionID    string         `json:"session_id"`
	Name         string         `json:"name"`
	State        string         `json:"state"`
	Reason       string         `json:"reason,omitempty"`
	VMID         string         `json:"vm_id,omitempty"`
	GuestIP      string         `json:"guest_ip,omitempty"`
	Stage        string         `json:"stage,omitempty"`
	Base         string         `json:"base,omitempty"`
	Created      string         `json:"created"`
	LastUsed     string         `json:"last_used"`
	IdleTimeoutS int            `json:"idle_timeout_s"`
	MaxLifetimeS int            `json:"max_lifetime_s"`
	IdleAction   string         `json:"idle_action,omitempty"`
	Execs        int            `json:"execs"`
	Exposed      []sess.Exposed `json:"exposed,omitempty"`
}

// SessionListResult is session_list's result.
type SessionListResult struct {
	Sessions []SessionEntry `json:"sessions"`
}

const sessionDescription = `A session is a microVM that stays up across calls, for work that needs state between commands: a dev server started in one call and queried in the next, an interpreter or build cache kept warm, a long build then quick iterations. Prefer sandbox_run for a one-off command. Sessions cost memory while they run: stop each with session_stop when done (an idle one stops after idle_timeout_s).`

// addSessionTools registers the session tools; session_expose only on
// stdio or where its operator allows it.
func (s *Server) addSessionTools() {
	startSchema := advertisedRunSchema(sessionStartSchema(), s.cfg.HostIO)
	addTool(s, &mcp.Tool{
		Name:  ToolSessionStart,
		Title: "Start a session (a VM that stays up)",
		Description: sessionDescription + "\n\nStarts one, with sandbox_run's VM arguments (stage, base, network, allow_hosts, allow_cidrs, inject, sizes, env, cwd, workspace); timeout_s bounds the boot. " +
			"Answers session_id, name, state, vm_id, guest_ip and its limits. Run commands in it with session_exec.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(true)},
		InputSchema: startSchema,
	}, sessionStartSchema(), inspectorArgs, s.sessionStart)

	addTool(s, &mcp.Tool{
		Name:  ToolSessionExec,
		Title: "Run a command in a session",
		Description: "Run cmd under /bin/sh -c in a session's VM (a paused one is resumed first: resumed true). Answers sandbox_run's outcome fields: exit_code, signal, timed_out, stdout and stderr (first 64 KiB, with *_truncated and exact *_bytes), duration_ms. " +
			"What cmd leaves running stays: start a server with background true (answers job_id; session_job reads it) and query it in the next exec. write_files puts files in first; read_files brings files back inline after.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(true)},
		Meta:        mcp.Meta{"anthropic/maxResultSizeChars": 100000},
		// A background exec answers session_id and job_id only.
		OutputSchema: withRequired(outputSchema[SessionExecResult](), "session_id"),
	}, sessionExecSchema(), inspectorArgs, s.sessionExec)

	addTool(s, &mcp.Tool{
		Name:        ToolSessionJob,
		Title:       "Read, wait for or kill a background job",
		Description: "Read a background job's new output and state (job: id, running, exit_code...), waiting up to wait_s for it to end; kill ends it.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(false)},
	}, boundedSchema[SessionJobArgs]("wait_s", 3600), nil, s.sessionJob)

	if !s.cfg.Remote || (s.cfg.Sessions != nil && s.cfg.Sessions.AllowExpose) {
		addTool(s, &mcp.Tool{
			Name:        ToolSessionExpose,
			Title:       "Relay a host port to a session's guest port",
			Description: "Relay a port on the server host's 127.0.0.1 to a TCP port in the session's VM, for the session's life (needs no network in the VM). Answers the address; useful only to a client on the server's host.",
			Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(false)},
		}, exposeSchema(), nil, s.sessionExpose)
	}

	s.addSessionStateTools()
}

// boundedSchema is In's schema with the integer argument name between 0
// and hi.
func boundedSchema[In any](name string, hi int) *jsonschema.Schema {
	sc := inputSchema[In]()
	p := sc.Properties[name]
	p.Type, p.Types, p.Minimum, p.Maximum = "integer", nil, floatp(0), floatp(float64(hi))
	return sc
}

// exposeSchema is session_expose's schema: ports are 1 to 65535.
func exposeSchema() *jsonschema.Schema {
	sc := inputSchema[SessionExposeArgs]()
	sc.Properties["guest_port"].Minimum, sc.Properties["guest_port"].Maximum = floatp(1), floatp(65535)
	sc.Properties["host_port"].Minimum, sc.Properties["host_port"].Maximum = floatp(0), floatp(65535)
	return sc
}

// withRequired is sc requiring only names.
func withRequired(sc *jsonschema.Schema, names ...string) *jsonschema.Schema {
	sc.Required = names
	return sc
}
