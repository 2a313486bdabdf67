package mcpserver

import (
	"context"
	"encoding/json"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	sess "isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// addSessionStateTools registers the tools that change or list a
// session's state: pause, resume, fork, commit, stop, list.
func (s *Server) addSessionStateTools() {
	ro := &mcp.ToolAnnotations{ReadOnlyHint: true, OpenWorldHint: boolp(false)}
	change := &mcp.ToolAnnotations{DestructiveHint: boolp(false), OpenWorldHint: boolp(false)}
	addTool(s, &mcp.Tool{
		Name: ToolSessionPause, Title: "Pause a session",
		Description: "Write a session's memory and state to disk and end its VM process: it holds no memory until resumed (session_resume, or any session_exec). Its processes, files and jobs come back as they were.",
		Annotations: change,
	}, inputSchema[SessionRefArgs](), nil, s.sessionPause)
	addTool(s, &mcp.Tool{
		Name: ToolSessionResume, Title: "Resume a paused session",
		Description: "Bring a paused session back, with its processes, files and jobs. Answers as session_start.",
		Annotations: change,
	}, inputSchema[SessionRefArgs](), nil, s.sessionResume)
	addTool(s, &mcp.Tool{
		Name: ToolSessionFork, Title: "Fork a session",
		Description: "Make a new session with the memory, processes and files of a running or paused one (which goes on as it was). Answers the new session as session_start does; stop it too when done.",
		Annotations: change,
	}, inputSchema[SessionForkArgs](), nil, s.sessionFork)
	addTool(s, &mcp.Tool{
		Name: ToolSessionCommit, Title: "Save a session's filesystem as a stage",
		Description: "Save a session's filesystem as a stage labelled label (the session keeps running); sandbox_run and session_start fork it with stage.",
		Annotations: change,
	}, inputSchema[SessionCommitArgs](), nil, s.sessionCommit)
	addTool(s, &mcp.Tool{
		Name: ToolSessionStop, Title: "Stop a session",
		Description: "Stop a session's VM (what it held is gone) and report its lifetime and exec count. Stop every session you started once you are done with it.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: boolp(true), IdempotentHint: true, OpenWorldHint: boolp(false)},
	}, inputSchema[SessionRefArgs](), nil, s.sessionStop)
	addTool(s, &mcp.Tool{
		Name: ToolSessionList, Title: "List sessions",
		Description: "List the sessions you can use, oldest first: session_id, name, state (running, paused, stopped, lost: its supervisor is gone), vm_id, created and last_used (RFC 3339), limits, execs, exposed ports.",
		Annotations: ro,
	}, inputSchema[NoArgs](), nil, s.sessionList)
}

func (s *Server) sessionJob(ctx context.Context, req *mcp.CallToolRequest, in SessionJobArgs) (*SessionJobResult, error) {
	ctx, done := s.track(ctx)
	defer done()
	if in.JobID == "" {
		return nil, s.sessionError(ctx, ToolSessionJob, &refusal{"job_id", "empty; give the job_id a background session_exec answered"})
	}
	var rep supervisor.JobReport
	call := sess.Call{Op: sess.OpJob, Job: in.JobID, WaitS: in.WaitS, Kill: in.Kill}
	rec, err := s.callSession(ctx, s.callerOf(req), in.SessionID, call, time.Duration(in.WaitS)*time.Second+callMargin, &rep)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionJob, err)
	}
	return &SessionJobResult{SessionID: rec.ID, Job: rep.Job, Stdout: rep.Stdout, Stderr: rep.Stderr}, nil
}

func (s *Server) sessionExpose(ctx context.Context, req *mcp.CallToolRequest, in SessionExposeArgs) (*SessionExposeResult, error) {
	ctx, done := s.track(ctx)
	defer done()
	var rep sess.Reply
	call := sess.Call{Op: sess.OpExpose, GuestPort: in.GuestPort, HostPort: in.HostPort}
	rec, err := s.callSession(ctx, s.callerOf(req), in.SessionID, call, callMargin, &rep)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionExpose, err)
	}
	return &SessionExposeResult{SessionID: rec.ID, GuestPort: in.GuestPort, Address: rep.Address}, nil
}

func (s *Server) sessionPause(ctx context.Context, req *mcp.CallToolRequest, in SessionRefArgs) (*SessionSummary, error) {
	ctx, done := s.track(ctx)
	defer done()
	rec, err := s.callSession(ctx, s.callerOf(req), in.SessionID, sess.Call{Op: sess.OpPause}, callMargin, nil)
	if err == nil {
		rec, err = s.cfg.Sessions.Store.Load(rec.ID)
	}
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionPause, err)
	}
	return sessionSummary(rec), nil
}

func (s *Server) sessionResume(ctx context.Context, req *mcp.CallToolRequest, in SessionRefArgs) (*SessionSummary, error) {
	ctx, done := s.track(ctx)
	defer done()
	rec, err := s.resolve(s.callerOf(req), in.SessionID)
	if err == nil {
		err = s.cfg.Sessions.NoBinary
	}
	if err == nil {
		sc := s.cfg.Sessions
		rec, err = sc.Launcher.Resume(ctx, sc.Store, rec.ID)
	}
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionResume, err)
	}
	out := sessionSummary(rec)
	out.Resumed = true
	return out, nil
}

func (s *Server) sessionFork(ctx context.Context, req *mcp.CallToolRequest, in SessionForkArgs) (*SessionSummary, error) {
	ctx, done := s.track(ctx)
	defer done()
	if in.Name != "" {
		if err := sess.CheckName(in.Name); err != nil {
			return nil, s.sessionError(ctx, ToolSessionFork, &refusal{"name", describe(in.Name) + ": use 1-63 of a-z, 0-9, '.', '_', '-', starting with a letter or digit, not ss-"})
		}
	}
	c := s.callerOf(req)
	rec, err := s.resolve(c, in.SessionID)
	if err == nil {
		err = s.cfg.Sessions.NoBinary
	}
	if err == nil {
		sc := s.cfg.Sessions
		if rec, err = sc.Launcher.Fork(ctx, sc.Store, rec.ID, in.Name); err == nil {
			err = setOwner(sc.Store, rec.ID, c)
		}
	}
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionFork, err)
	}
	return sessionSummary(rec), nil
}

func (s *Server) sessionCommit(ctx context.Context, req *mcp.CallToolRequest, in SessionCommitArgs) (*SessionCommitResult, error) {
	ctx, done := s.track(ctx)
	defer done()
	if in.Label == "" {
		return nil, s.sessionError(ctx, ToolSessionCommit, &refusal{"label", "empty; give the stage a label such as myproj/deps"})
	}
	var stage map[string]any
	rec, err := s.callSession(ctx, s.callerOf(req), in.SessionID, sess.Call{Op: sess.OpCommit, Label: in.Label}, 10*time.Minute, &stage)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionCommit, err)
	}
	delete(stage, "ok")
	return &SessionCommitResult{SessionID: rec.ID, Label: in.Label, Stage: stage}, nil
}

func (s *Server) sessionStop(ctx context.Context, req *mcp.CallToolRequest, in SessionRefArgs) (*SessionStopResult, error) {
	ctx, done := s.track(ctx)
	defer done()
	rec, err := s.resolve(s.callerOf(req), in.SessionID)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionStop, err)
	}
	if !rec.Live() {
		// Stopping what is over says how it ended.
		return &SessionStopResult{SessionID: rec.ID, Name: rec.Name, State: rec.State, Reason: rec.Reason, VMID: rec.VMID,
			LifetimeS: lifetime(rec), Execs: rec.Execs}, nil
	}
	res, err := s.cfg.Sessions.Store.Call(ctx, rec.ID, sess.Call{Op: sess.OpStop}, callMargin)
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionStop, err)
	}
	var f supervisor.Final
	if err := json.Unmarshal(res, &f); err != nil {
		return nil, s.sessionError(ctx, ToolSessionStop, err)
	}
	sess.WaitExit(rec, 10*time.Second)
	return &SessionStopResult{SessionID: f.SessionID, Name: f.Name, State: f.State, Reason: f.Reason, VMID: f.VMID,
		LifetimeS: f.LifetimeS, Execs: f.Execs}, nil
}

// lifetime is how long rec ran, to its stop.
func lifetime(rec *sess.Record) float64 {
	if rec.Stopped.IsZero() {
		return 0
	}
	return rec.Stopped.Sub(rec.Created).Seconds()
}

func (s *Server) sessionList(ctx context.Context, req *mcp.CallToolRequest, _ NoArgs) (*SessionListResult, error) {
	sc, err := s.sessions()
	if err != nil {
		return nil, s.sessionError(ctx, ToolSessionList, err)
	}
	c := s.callerOf(req)
	out := &SessionListResult{Sessions: []SessionEntry{}}
	for _, r := range sc.Store.List() {
		if !c.sees(sc.Store, r.ID) {
			continue
		}
		out.Sessions = append(out.Sessions, SessionEntry{SessionID: r.ID, Name: r.Name, State: r.State, Reason: r.Reason,
			VMID: r.VMID, GuestIP: r.GuestIP, Stage: r.Spec.Stage, Base: r.Spec.Base,
			Created: r.Created.Format(time.RFC3339), LastUsed: r.LastUsed.Format(time.RFC3339),
			IdleTimeoutS: r.IdleTimeoutS, MaxLifetimeS: r.MaxLifetimeS, IdleAction: r.IdleAction, Execs: r.Execs, Exposed: r.Exposed})
	}
	return out, nil
}
