package mcpserver

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
	"isopod/internal/sandbox"
	sess "isopod/internal/session"
)

// Sessions over MCP: the same sessions the CLI's `isopod session` keeps
// (internal/session), under the same state root, so that a session
// started here is listed by the CLI and outlives this server. Each is
// owned by a supervisor process, the hidden `session-supervisor` command
// of the isopod binary, which this server starts with its own settings.
//
// Over HTTP a session belongs to the token that started it: its owner id
// (ownerOf) is kept in the session's directory, beside the record, where
// no supervisor writes. Another run token gets not_found for it, in the
// same words as for a session that does not exist, and does not list it;
// an admin token sees and acts on every session. On stdio the local user
// owns every session, as in the CLI.

// Tool names of sessions.
const (
	ToolSessionStart  = "session_start"
	ToolSessionExec   = "session_exec"
	ToolSessionJob    = "session_job"
	ToolSessionExpose = "session_expose"
	ToolSessionPause  = "session_pause"
	ToolSessionResume = "session_resume"
	ToolSessionFork   = "session_fork"
	ToolSessionCommit = "session_commit"
	ToolSessionStop   = "session_stop"
	ToolSessionList   = "session_list"
)

// SessionTools are the session tools, in the order they are registered.
var SessionTools = []string{ToolSessionStart, ToolSessionExec, ToolSessionJob, ToolSessionExpose, ToolSessionPause,
	ToolSessionResume, ToolSessionFork, ToolSessionCommit, ToolSessionStop, ToolSessionList}

// OfferedTools are the tools a server lists: ToolNames, less
// session_expose on a network listener whose operator did not allow it.
func OfferedTools(remote, allowExpose bool) []string {
	if !remote || allowExpose {
		return slices.Clone(ToolNames)
	}
	return slices.DeleteFunc(slices.Clone(ToolNames), func(n string) bool { return n == ToolSessionExpose })
}

// SessionConfig is what the session tools need.
type SessionConfig struct {
	// Store is the state root's sessions (the CLI's).
	Store sess.Store
	// Launcher starts supervisors: the isopod binary, with this server's
	// settings as its environment.
	Launcher sess.Launcher
	// Check refuses, before any record or process, what a session's VM
	// would refuse (sandbox.Service.CheckVM).
	Check func(ctx context.Context, req sandbox.Request) error
	// NoBinary, when set, says why no supervisor can be started (the
	// isopod binary is missing): session_start and session_fork fail
	// with it.
	NoBinary error
	// AllowExpose registers session_expose on a network listener (on
	// stdio it always is): its host port opens on this host's loopback.
	AllowExpose bool
	// MaxLifetimeS caps a session's max_lifetime_s (0: no cap); the
	// setting that raises it is LifetimeSetting.
	MaxLifetimeS    int
	LifetimeSetting string
}

// FindIsopod is the isopod binary a server starts supervisors with: the
// one beside self (this server's executable), else the first on PATH.
func FindIsopod(self string) (string, error) {
	if self != "" {
		p := filepath.Join(filepath.Dir(self), "isopod")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	p, err := exec.LookPath("isopod")
	if err != nil {
		return "", fmt.Errorf("sessions need the isopod binary (it runs each session's supervisor), and there is none beside %s nor on PATH: install isopod and isopod-mcp together: %w",
			self, errdefs.ErrFailedPrecondition)
	}
	return p, nil
}

// callMargin bounds a supervisor call beyond the guest time it asks for.
const callMargin = 60 * time.Second

// caller is who a session call comes from.
type caller struct {
	owner string // the token's owner id; "" on stdio
	all   bool   // sees every session: stdio, or an admin token
}

// callerOf says who req comes from.
func (s *Server) callerOf(req *mcp.CallToolRequest) caller {
	if !s.cfg.Remote {
		return caller{all: true}
	}
	if req == nil || req.Extra == nil || req.Extra.TokenInfo == nil {
		return caller{}
	}
	ti := req.Extra.TokenInfo
	owner, _ := ti.Extra[ownerKey].(string)
	return caller{owner: owner, all: slices.Contains(ti.Scopes, RoleAdmin)}
}

// ownerFile is where session id's owner id is kept.
func ownerFile(st sess.Store, id string) string {
	return filepath.Join(st.SessionDir(id), "mcp-owner")
}

// setOwner records c as the owner of session id (nothing on stdio).
func setOwner(st sess.Store, id string, c caller) error {
	if c.owner == "" {
		return nil
	}
	if err := os.WriteFile(ownerFile(st, id), []byte(c.owner+"\n"), 0o600); err != nil {
		return fmt.Errorf("recording the session's owner: %w", err)
	}
	return nil
}

// sees reports whether c may see session id.
func (c caller) sees(st sess.Store, id string) bool {
	if c.all {
		return true
	}
	if c.owner == "" {
		return false
	}
	b, err := os.ReadFile(ownerFile(st, id))
	return err == nil && strings.TrimSpace(string(b)) == c.owner
}

// noSession is the one answer for a session that does not exist and for
// one the caller may not see.
func noSession(ref string) error {
	return fmt.Errorf("no session %s: %w", describe(ref), errdefs.ErrNotFound)
}

// sessions is the server's session setup, or an error saying it has none.
func (s *Server) sessions() (*SessionConfig, error) {
	if s.cfg.Sessions == nil {
		return nil, fmt.Errorf("this server keeps no sessions: %w", errdefs.ErrNotSupported)
	}
	return s.cfg.Sessions, nil
}

// resolve finds the session ref names (an id, or a name: the live one,
// else the newest) among those c sees.
func (s *Server) resolve(c caller, ref string) (*sess.Record, error) {
	sc, err := s.sessions()
	if err != nil {
		return nil, err
	}
	st := sc.Store
	if strings.TrimSpace(ref) == "" {
		return nil, &refusal{"session_id", "empty; give a session_id or name from session_start or session_list"}
	}
	if strings.HasPrefix(ref, "ss-") {
		rec, err := st.Load(ref)
		if err != nil || !c.sees(st, rec.ID) {
			return nil, noSession(ref)
		}
		return rec, nil
	}
	var found *sess.Record
	for _, r := range st.List() {
		if r.Name != ref || !c.sees(st, r.ID) {
			continue
		}
		if found == nil || r.Live() || !found.Live() {
			found = r
		}
	}
	if found == nil {
		return nil, noSession(ref)
	}
	return found, nil
}

// callSession sends call to the live session ref names, within d, and
// decodes its result into out (nil: none).
func (s *Server) callSession(ctx context.Context, c caller, ref string, call sess.Call, d time.Duration, out any) (*sess.Record, error) {
	rec, err := s.resolve(c, ref)
	if err != nil {
		return nil, err
	}
	return rec, s.call(ctx, rec.ID, call, d, out)
}

// call sends call to session id, within d, and decodes its result into
// out (nil: none).
func (s *Server) call(ctx context.Context, id string, call sess.Call, d time.Duration, out any) error {
	res, err := s.cfg.Sessions.Store.Call(ctx, id, call, d)
	if err != nil || out == nil {
		return err
	}
	if err := json.Unmarshal(res, out); err != nil {
		return fmt.Errorf("reading the supervisor's answer: %w", err)
	}
	return nil
}

// SessionSummary is what session_start, session_resume and session_fork
// answer: the CLI's summary, without ok.
type SessionSummary struct {
	SessionID    string   `json:"session_id"`
	Name         string   `json:"name"`
	State        string   `json:"state"`
	VMID         string   `json:"vm_id,omitempty"`
	Path         string   `json:"path,omitempty"`
	GuestIP      string   `json:"guest_ip,omitempty"`
	IdleTimeoutS int      `json:"idle_timeout_s"`
	MaxLifetimeS int      `json:"max_lifetime_s"`
	IdleAction   string   `json:"idle_action,omitempty"`
	Resumed      bool     `json:"resumed,omitempty"`
	Warnings     []string `json:"warnings,omitempty"`
}

func sessionSummary(rec *sess.Record) *SessionSummary {
	sm := rec.Summary()
	out := &SessionSummary{SessionID: sm.SessionID, Name: sm.Name, State: sm.State, VMID: sm.VMID, Path: sm.Path,
		GuestIP: sm.GuestIP, IdleTimeoutS: sm.IdleTimeoutS, MaxLifetimeS: sm.MaxLifetimeS, IdleAction: rec.IdleAction,
		Resumed: sm.Resumed}
	for _, w := range sm.Warnings {
		out.Warnings = append(out.Warnings, mcpWords.Replace(w))
	}
	return out
}

// sessionError words a session tool's failure: an argument problem is a
// refusal, anything else a failure with a fix for sessions.
func (s *Server) sessionError(ctx context.Context, tool string, err error) error {
	if err == nil {
		return nil
	}
	err = &reworded{msg: sessionWords.Replace(err.Error()), err: err}
	if ctx.Err() != nil {
		return fmt.Errorf("%s cancelled: %v", tool, plain(err))
	}
	if isRefusal(err) {
		s.log.Info("tool refused", "tool", tool, "err", err)
		return errors.New(refusalText(tool, err))
	}
	class := errdefs.Class(err)
	fix := map[string]string{
		"not_found":           "session_list shows the sessions you can use; session_start starts a new one.",
		"already_exists":      "that session name is taken by a live session: choose another name, or stop that session first.",
		"failed_precondition": "the session is not running (its state is named above): session_resume a paused one, or session_start a new one.",
		"unavailable":         "the session's VM or supervisor did not answer in time; retry, or session_stop it and start a new one.",
		"not_supported":       "this host cannot do that for a session (named above); use session_stop and session_start instead.",
	}[class]
	if fix == "" {
		fix = fixFor(class)
	}
	s.log.Info("tool failed", "tool", tool, "class", class, "err", err)
	return fmt.Errorf("%s failed (%s): %s. Fix: %s", tool, class, mcpWords.Replace(plain(err)), fix)
}

// sessionWords rewrites the CLI's session vocabulary in supervisor
// messages into the MCP server's.
var sessionWords = strings.NewReplacer(
	"isopod session ls", "session_list",
	"isopod session jobs", "session_exec with background",
	"isopod session job", "session_job",
	"--detach", "background",
)
