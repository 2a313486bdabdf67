package mcpserver

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/agentclient"
	"isopod/internal/errdefs"
	"isopod/internal/hostio"
	"isopod/internal/report"
	"isopod/internal/sandbox"
	sess "isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// Caps of session_exec's write_files (read_files has sandbox_run's).
const (
	// MaxWriteFiles is how many files one call may write.
	MaxWriteFiles = 16
	// MaxWriteFilesBytes caps the content of a call's files together,
	// decoded.
	MaxWriteFilesBytes = 4 << 20
)

// SessionExecArgs is session_exec's input.
type SessionExecArgs struct {
	SessionID  string            `json:"session_id" jsonschema:"the session: its session_id (ss-...) or its name"`
	Cmd        string            `json:"cmd" jsonschema:"shell command to run in the session's VM, as /bin/sh -c CMD (as sandbox_run's cmd). What it leaves running (a server started with & or nohup) keeps running for the next exec"`
	TimeoutS   int               `json:"timeout_s,omitempty" jsonschema:"seconds before the command is killed (default 120, at most 3600); the session lives on. With background: none unless given"`
	Env        map[string]string `json:"env,omitempty" jsonschema:"environment variables for cmd, added to the session's, as an object of NAME: value"`
	Cwd        string            `json:"cwd,omitempty" jsonschema:"working directory inside the VM (default: the session's)"`
	Stdin      string            `json:"stdin,omitempty" jsonschema:"text fed to cmd's standard input (at most 4 MiB)"`
	Background bool              `json:"background,omitempty" jsonschema:"start cmd as a background job and answer at once with its job_id; session_job reads its output, waits for it or kills it. For a dev server or a long build"`
	WriteFiles []WriteFileArg    `json:"write_files,omitempty" jsonschema:"files written into the VM before cmd runs (missing parent directories are made; a file that cannot be written fails the call and cmd does not run): at most 16 files and 4 MiB of content in all"`
	ReadFiles  []string          `json:"read_files,omitempty" jsonschema:"absolute paths of files inside the VM read back after cmd, in the result's files: text as it is, anything else base64; at most 16 files and 4 MiB in all (a file past that is cut, truncated true). Not with background"`
}

// WriteFileArg is one file session_exec writes.
type WriteFileArg struct {
	Path     string `json:"path" jsonschema:"absolute path of the file inside the VM; an existing file is replaced"`
	Content  string `json:"content" jsonschema:"the file's content, as encoding says"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default: content is the text) or base64 (content is the bytes, base64-encoded)"`
	Mode     int    `json:"mode,omitempty" jsonschema:"the file's permission bits as a number, e.g. 493 for 0755 (default 420, 0644)"`
}

// SessionExecResult is session_exec's result: a run report's outcome of
// the one command, or the job a background exec started.
type SessionExecResult struct {
	SessionID string `json:"session_id"`
	// Resumed: the session was paused, and this call resumed it first.
	Resumed bool `json:"resumed,omitempty"`
	// JobID is a background exec's job.
	JobID string `json:"job_id,omitempty"`

	*report.Outcome
	DurationMS    *int64 `json:"duration_ms,omitempty"`
	StdoutLogPath string `json:"stdout_log_path,omitempty"`
	StderrLogPath string `json:"stderr_log_path,omitempty"`

	Files    []FileResult `json:"files,omitempty"`
	Warnings []string     `json:"warnings,omitempty"`
}

// sessionExecSchema is session_exec's schema, with sandbox_run's entries
// for the arguments they share.
func sessionExecSchema() *jsonschema.Schema {
	sc := inputSchema[SessionExecArgs]()
	run := runInputSchema()
	for _, name := range []string{"env", "read_files"} {
		p := *run.Properties[name]
		p.Description = sc.Properties[name].Description
		sc.Properties[name] = &p
	}
	t := sc.Properties["timeout_s"]
	t.Minimum, t.Maximum = floatp(1), floatp(sandbox.MaxTimeoutS)
	wf := sc.Properties["write_files"]
	wf.Type, wf.Types = "array", nil
	enc := wf.Items.Properties["encoding"]
	enc.Enum, enc.Default = []any{"utf-8", "base64"}, mustJSON("utf-8")
	mode := wf.Items.Properties["mode"]
	mode.Minimum, mode.Maximum, mode.Default = floatp(0), floatp(0o7777), mustJSON(0o644)
	return sc
}

// execCall is session_exec's call, checked; files are write_files
// decoded.
func execCall(in SessionExecArgs) (sess.Call, []sess.Call, error) {
	if strings.TrimSpace(in.Cmd) == "" {
		return sess.Call{}, nil, &refusal{"cmd", "empty; give the shell command to run, e.g. \"echo hi\""}
	}
	if in.Background && len(in.ReadFiles) > 0 {
		return sess.Call{}, nil, &refusal{"read_files", "reads after the command, and a background command has no after: read them with a later session_exec"}
	}
	if len(in.Stdin) > hostio.MaxStdinFileBytes {
		return sess.Call{}, nil, &refusal{"stdin", fmt.Sprintf("is %d bytes; at most %d (4 MiB): write larger inputs with write_files", len(in.Stdin), hostio.MaxStdinFileBytes)}
	}
	env, err := envPairs(in.Env)
	if err != nil {
		return sess.Call{}, nil, err
	}
	if in.Cwd != "" {
		if err := agentclient.CheckGuestPath("cwd", in.Cwd); err != nil {
			return sess.Call{}, nil, err
		}
	}
	c := sess.Call{Op: sess.OpExec, Argv: []string{in.Cmd}, Shell: true, Env: env, Cwd: in.Cwd,
		TimeoutS: in.TimeoutS, Detach: in.Background}
	if in.Stdin != "" {
		c.Stdin = []byte(in.Stdin)
	}
	puts, err := writeCalls(in.WriteFiles)
	if err != nil {
		return c, nil, err
	}
	if err := checkReadFiles(in.ReadFiles); err != nil {
		return c, nil, err
	}
	return c, puts, nil
}

// writeCalls are the put calls of write_files, within their caps.
func writeCalls(files []WriteFileArg) ([]sess.Call, error) {
	if len(files) > MaxWriteFiles {
		return nil, &refusal{"write_files", fmt.Sprintf("names %d files; at most %d (write an archive and unpack it in cmd)", len(files), MaxWriteFiles)}
	}
	var puts []sess.Call
	total := 0
	for i, f := range files {
		at := fmt.Sprintf("write_files[%d]", i)
		if !strings.HasPrefix(f.Path, "/") {
			return nil, &refusal{at + ".path", fmt.Sprintf("give the file's absolute path inside the VM (got %s)", describe(f.Path))}
		}
		if err := agentclient.CheckGuestPath(at+".path", f.Path); err != nil {
			return nil, err
		}
		data := []byte(f.Content)
		switch f.Encoding {
		case "", "utf-8":
		case "base64":
			var err error
			if data, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return nil, &refusal{at + ".content", "is not valid base64; encode the bytes with standard base64, or give text with encoding utf-8"}
			}
		default:
			return nil, &refusal{at + ".encoding", fmt.Sprintf("use utf-8 or base64 (got %s)", describe(f.Encoding))}
		}
		if total += len(data); total > MaxWriteFilesBytes {
			return nil, &refusal{"write_files", fmt.Sprintf("hold more than %d bytes (4 MiB) in all; bring larger files in with a workspace at session_start, or fetch them over the network in cmd", MaxWriteFilesBytes)}
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o644
		}
		puts = append(puts, sess.Call{Op: sess.OpPut, Path: f.Path, Mode: uint32(mode), Data: data})
	}
	return puts, nil
}

// checkReadFiles refuses read_files sandbox_run would refuse.
func checkReadFiles(guests []string) error {
	if len(guests) > MaxReadFiles {
		return &refusal{"read_files", fmt.Sprintf("names %d files; at most %d (archive them with tar in cmd and read the archive)", len(guests), MaxReadFiles)}
	}
	for i, g := range guests {
		if !strings.HasPrefix(g, "/") {
			return &refusal{fmt.Sprintf("read_files[%d]", i), fmt.Sprintf("give the file's absolute path inside the VM (got %s)", describe(g))}
		}
		if err := agentclient.CheckGuestPath(fmt.Sprintf("read_files[%d]", i), g); err != nil {
			return err
		}
	}
	return nil
}

// sessionExec is the session_exec handler: a paused session resumed,
// write_files put, the command run (or started as a job), read_files got.
func (s *Server) sessionExec(ctx context.Context, req *mcp.CallToolRequest, in SessionExecArgs) (*SessionExecResult, error) {
	ctx, done := s.track(ctx)
	defer done()
	call, puts, err := execCall(in)
	if err != nil {
		s.log.Info("tool refused", "tool", ToolSessionExec, "err", err)
		return nil, errors.New(refusalText(ToolSessionExec, err))
	}
	rec, err := s.resolve(s.callerOf(req), in.SessionID)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionExec, err)
	}
	stop := s.keepalive(ctx, req, newToolStatus(ToolSessionExec))
	defer stop()
	sc := s.cfg.Sessions
	resumed, err := sc.Launcher.Wake(ctx, sc.Store, rec.ID)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionExec, err)
	}
	out := &SessionExecResult{SessionID: rec.ID, Resumed: resumed}
	for i, p := range puts {
		if err := s.call(ctx, rec.ID, p, callMargin, nil); err != nil {
			return nil, s.writeError(ctx, i, p.Path, err)
		}
	}
	d := time.Duration(max(call.TimeoutS, sandbox.DefaultTimeoutS))*time.Second + callMargin
	if call.Detach {
		var rep sess.Reply
		if err := s.call(ctx, rec.ID, call, callMargin, &rep); err != nil {
			return nil, s.sessionError(ctx, ToolSessionExec, err)
		}
		out.JobID = rep.JobID
		return out, nil
	}
	var rep supervisor.ExecReport
	if err := s.call(ctx, rec.ID, call, d, &rep); err != nil {
		return nil, s.sessionError(ctx, ToolSessionExec, err)
	}
	out.Outcome, out.DurationMS = &rep.Outcome, &rep.ExecMS
	out.StdoutLogPath, out.StderrLogPath = rep.StdoutLogPath, rep.StderrLogPath
	out.Files, out.Warnings = s.readSessionFiles(ctx, rec.ID, in.ReadFiles)
	return out, nil
}

// readSessionFiles gets read_files from the session, within
// MaxReadFilesInline together; a file it cannot get is a warning.
func (s *Server) readSessionFiles(ctx context.Context, id string, guests []string) ([]FileResult, []string) {
	budget := MaxReadFilesInline
	var files []FileResult
	var warns []string
	for i, g := range guests {
		var got supervisor.GetResult
		if err := s.call(ctx, id, sess.Call{Op: sess.OpGet, Path: g}, callMargin, &got); err != nil {
			warns = append(warns, fmt.Sprintf("read_files[%d] %s: %s", i, g, plain(err)))
			continue
		}
		raw := got.Data[:min(len(got.Data), max(budget, 0))]
		budget -= len(raw)
		files = append(files, inlineFile(g, raw, int64(len(got.Data))))
	}
	return files, warns
}

// writeError words a write_files failure: the session's own (not running,
// not answering) as any session tool's, the file's with its fix. cmd did
// not run.
func (s *Server) writeError(ctx context.Context, i int, path string, err error) error {
	if ctx.Err() != nil || errors.Is(err, errdefs.ErrUnavailable) || errors.Is(err, errdefs.ErrFailedPrecondition) {
		return s.sessionError(ctx, ToolSessionExec, err)
	}
	s.log.Info("tool failed", "tool", ToolSessionExec, "class", errdefs.Class(err), "err", err)
	return fmt.Errorf("%s failed (%s): write_files[%d] %s: %s. Fix: cmd did not run; give a path the VM can write as a file (not a directory, not on a read-only mount), then call again.",
		ToolSessionExec, errdefs.Class(err), i, describe(path), plain(err))
}
