package mcpserver

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"isopod/internal/credential"
	"isopod/internal/errdefs"
	"isopod/internal/paths"
	"isopod/internal/sandbox"
	sess "isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// testSessions is a session setup over a fresh state root whose
// "isopod" records that it was started (in started) and fails; check is
// the core's CheckVM (nil: everything passes).
func testSessions(t *testing.T, check func(context.Context, sandbox.Request) error) (sc *SessionConfig, started string) {
	t.Helper()
	dir := t.TempDir()
	p, err := paths.New(filepath.Join(dir, "home"))
	if err != nil {
		t.Fatal(err)
	}
	started = filepath.Join(dir, "started")
	bin := filepath.Join(dir, "isopod")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho \"$@\" >> "+started+"\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if check == nil {
		check = func(context.Context, sandbox.Request) error { return nil }
	}
	return &SessionConfig{Store: sess.Store{Paths: p}, Launcher: sess.Launcher{Binary: bin}, Check: check}, started
}

// TestSessionStartRefusals: bad arguments are refused, naming the
// argument, before any record or supervisor; the core's own checks
// (sizes, network) apply as to sandbox_run.
func TestSessionStartRefusals(t *testing.T) {
	core, _ := newFakeCore(t)
	sc, started := testSessions(t, core.CheckVM)
	sc.MaxLifetimeS, sc.LifetimeSetting = 100, "ISOPOD_SESSION_MAX_LIFETIME_S"
	s := connect(t, Config{Core: core, Sessions: sc, NoStartupGC: true, GCEvery: -1})
	for _, c := range []struct {
		args map[string]any
		want string
	}{
		{map[string]any{"name": "Bad Name"}, "session_start refused: name: "},
		{map[string]any{"name": "ss-x"}, "session_start refused: name: "},
		{map[string]any{"idle_action": "sleep"}, "session_start refused: idle_action: use stop or pause"},
		{map[string]any{"idle_timeout_s": 0}, "session_start refused: idle_timeout_s: must be at least 1"},
		{map[string]any{"max_lifetime_s": 101}, "session_start refused: max_lifetime_s 101 is over this host's cap of 100 s (ISOPOD_SESSION_MAX_LIFETIME_S)"},
		{map[string]any{"vcpus": 3}, "session_start refused: vcpus"},
		{map[string]any{"network": false, "allow_hosts": []any{"pypi.org"}}, "session_start refused: network: "},
		{map[string]any{"env": map[string]any{"A=B": "1"}}, "session_start refused: env: "},
		{map[string]any{"commit_as": "x/y"}, "session_start refused: commit_as: unknown"},
		{map[string]any{"base": "base-min", "stage": "no-such-stage"}, "session_start refused: "},
	} {
		res := s.call(t, context.Background(), ToolSessionStart, c.args, nil)
		if text := resultText(res); !res.IsError || !strings.HasPrefix(text, c.want) {
			t.Errorf("session_start %v: %q; want %q...", c.args, text, c.want)
		}
	}
	if recs := sc.Store.List(); len(recs) != 0 {
		t.Errorf("refused starts left %d session records", len(recs))
	}
	if _, err := os.Stat(started); err == nil {
		t.Error("a refused start ran a supervisor")
	}
}

// TestSessionStartWithoutIsopod: a server without the isopod binary says
// so, naming it, and makes no record.
func TestSessionStartWithoutIsopod(t *testing.T) {
	sc, _ := testSessions(t, nil)
	dir := t.TempDir()
	t.Setenv("PATH", dir)
	_, sc.NoBinary = FindIsopod(filepath.Join(dir, "isopod-mcp"))
	if !errors.Is(sc.NoBinary, errdefs.ErrFailedPrecondition) {
		t.Fatalf("FindIsopod in an empty directory: %v", sc.NoBinary)
	}
	s := connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSessionStart, map[string]any{"base": "base-min"}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, "the isopod binary") || !strings.Contains(text, "install isopod and isopod-mcp together") {
		t.Errorf("session_start without isopod: %q", text)
	}
	if recs := sc.Store.List(); len(recs) != 0 {
		t.Errorf("%d session records", len(recs))
	}
	// Beside the server's own binary, it is found.
	bin := filepath.Join(dir, "isopod")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := FindIsopod(filepath.Join(dir, "isopod-mcp")); err != nil || got != bin {
		t.Errorf("FindIsopod beside the server: %q, %v", got, err)
	}
}

// TestSessionStartLaunches: a start that passes its checks records the
// session (owned, over HTTP, by its token) and starts its supervisor; a
// supervisor that fails is reported with its log.
func TestSessionStartLaunches(t *testing.T) {
	sc, started := testSessions(t, nil)
	h := startHTTP(t, Config{Core: &scriptedCore{}, Sessions: sc}, nil)
	s := mustConnectHTTP(t, h.url, runToken)
	res := s.call(t, context.Background(), ToolSessionStart, map[string]any{"base": "base-min", "name": "web", "idle_action": "pause"}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, "supervisor ended before its VM was ready") {
		t.Errorf("session_start with a failing supervisor: %q", text)
	}
	recs := sc.Store.List()
	if len(recs) != 1 || recs[0].Name != "web" || recs[0].IdleAction != sess.IdlePause || recs[0].Spec.DefaultBase != DefaultBase {
		t.Fatalf("records: %+v", recs)
	}
	if r := supervisor.RequestOf(recs[0].Spec, nil); !recs[0].Spec.ModelCaller || r.Caller != credential.Model || r.DefaultBase != DefaultBase {
		t.Errorf("the session's request does not keep sandbox_run's default base and that a model names its credentials: %+v", recs[0].Spec)
	}
	if b, err := os.ReadFile(started); err != nil || !strings.Contains(string(b), "session-supervisor --id "+recs[0].ID) {
		t.Errorf("the supervisor's arguments: %q, %v", b, err)
	}
	owner, err := os.ReadFile(ownerFile(sc.Store, recs[0].ID))
	if err != nil || strings.TrimSpace(string(owner)) != ownerOf(runToken) || strings.Contains(string(owner), runToken) {
		t.Errorf("owner file: %q, %v", owner, err)
	}
}

// TestSessionOwnership: over HTTP a run token sees its own sessions only,
// and another's gets the answer a missing one gets, by id and by name;
// an admin token sees all; on stdio every session is the local user's.
func TestSessionOwnership(t *testing.T) {
	sc, _ := testSessions(t, nil)
	mine := newRecord(t, sc, "mine", ownerOf(runToken))
	theirs := newRecord(t, sc, "theirs", ownerOf("another-token-0123456789"))
	cli := newRecord(t, sc, "cli", "")
	h := startHTTP(t, Config{Core: &scriptedCore{}, Sessions: sc}, nil)
	run, admin := mustConnectHTTP(t, h.url, runToken), mustConnectHTTP(t, h.url, adminToken)
	local := connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true})

	for _, c := range []struct {
		name string
		s    *session
		want []string
	}{
		{"run token", run, []string{mine}},
		{"admin token", admin, []string{mine, theirs, cli}},
		{"stdio", local, []string{mine, theirs, cli}},
	} {
		if got := listIDs(t, c.s); !slices.Equal(got, c.want) {
			t.Errorf("%s lists %v; want %v", c.name, got, c.want)
		}
	}
	missing := callText(t, run, ToolSessionStop, "ss-000000000000")
	if !strings.Contains(missing, "(not_found)") {
		t.Fatalf("a missing session: %q", missing)
	}
	for _, ref := range []string{theirs, "theirs", cli, "cli"} {
		for _, tool := range []string{ToolSessionStop, ToolSessionPause, ToolSessionResume} {
			got := callText(t, run, tool, ref)
			want := strings.ReplaceAll(strings.ReplaceAll(missing, "ss-000000000000", ref), ToolSessionStop, tool)
			if got != want {
				t.Errorf("%s %s with another's token: %q; want %q", tool, ref, got, want)
			}
		}
	}
	if got := callText(t, run, ToolSessionStop, "mine"); strings.Contains(got, "not_found") {
		t.Errorf("the owner's stop of its session: %q", got)
	}
	if got := callText(t, admin, ToolSessionStop, "theirs"); strings.Contains(got, "not_found") {
		t.Errorf("the admin's stop of another's session: %q", got)
	}
}

// newRecord makes a starting session named name, owned by owner ("": a
// CLI session), and returns its id.
func newRecord(t *testing.T, sc *SessionConfig, name, owner string) string {
	t.Helper()
	rec, err := sc.Store.Create(name, sess.Spec{Base: "base-min"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := setOwner(sc.Store, rec.ID, caller{owner: owner}); err != nil {
		t.Fatal(err)
	}
	return rec.ID
}

func listIDs(t *testing.T, s *session) []string {
	t.Helper()
	res := s.call(t, context.Background(), ToolSessionList, map[string]any{}, nil)
	var out SessionListResult
	if err := json.Unmarshal([]byte(resultText(res)), &out); err != nil || res.IsError {
		t.Fatalf("session_list: %s", resultText(res))
	}
	var ids []string
	for _, e := range out.Sessions {
		ids = append(ids, e.SessionID)
	}
	return ids
}

func callText(t *testing.T, s *session, tool, ref string) string {
	t.Helper()
	return resultText(s.call(t, context.Background(), tool, map[string]any{"session_id": ref}, nil))
}

// TestSessionExposeOffered: session_expose is offered on stdio, and over
// HTTP only when the operator allows it.
func TestSessionExposeOffered(t *testing.T) {
	sc, _ := testSessions(t, nil)
	offered := func(s *session) bool {
		res, err := s.cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, tl := range res.Tools {
			if tl.Name == ToolSessionExpose {
				return true
			}
		}
		return false
	}
	if !offered(connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true})) {
		t.Error("session_expose is not offered on stdio")
	}
	h := startHTTP(t, Config{Core: &scriptedCore{}, Sessions: sc}, nil)
	if offered(mustConnectHTTP(t, h.url, adminToken)) {
		t.Error("session_expose is offered over HTTP without --allow-session-expose")
	}
	allowed := *sc
	allowed.AllowExpose = true
	h = startHTTP(t, Config{Core: &scriptedCore{}, Sessions: &allowed}, nil)
	if !offered(mustConnectHTTP(t, h.url, runToken)) {
		t.Error("session_expose is not offered over HTTP with --allow-session-expose")
	}
}

// TestSessionExecArgs: session_exec's arguments within their caps become
// the calls; past them, refused naming the argument.
func TestSessionExecArgs(t *testing.T) {
	files := func(n, size int) []WriteFileArg {
		var out []WriteFileArg
		for i := range n {
			out = append(out, WriteFileArg{Path: "/tmp/f" + string(rune('a'+i)), Content: strings.Repeat("x", size)})
		}
		return out
	}
	for _, c := range []struct {
		name string
		in   SessionExecArgs
		want string // a refusal's start; "" for none
	}{
		{"plain", SessionExecArgs{Cmd: "true", WriteFiles: files(16, 1000), ReadFiles: make16("/etc/hostname")}, ""},
		{"empty cmd", SessionExecArgs{Cmd: " "}, "cmd: empty"},
		{"17 files", SessionExecArgs{Cmd: "true", WriteFiles: files(17, 1)}, "write_files: names 17 files"},
		{"over 4 MiB", SessionExecArgs{Cmd: "true", WriteFiles: files(2, 2<<20+1)}, "write_files: hold more than"},
		{"relative path", SessionExecArgs{Cmd: "true", WriteFiles: []WriteFileArg{{Path: "tmp/x"}}}, "write_files[0].path: give the file's absolute path"},
		{"bad base64", SessionExecArgs{Cmd: "true", WriteFiles: []WriteFileArg{{Path: "/x", Content: "!!", Encoding: "base64"}}}, "write_files[0].content: is not valid base64"},
		{"bad encoding", SessionExecArgs{Cmd: "true", WriteFiles: []WriteFileArg{{Path: "/x", Encoding: "hex"}}}, "write_files[0].encoding: use utf-8 or base64"},
		{"17 reads", SessionExecArgs{Cmd: "true", ReadFiles: append(make16("/a"), "/b")}, "read_files: names 17 files"},
		{"relative read", SessionExecArgs{Cmd: "true", ReadFiles: []string{"a"}}, "read_files[0]: give the file's absolute path"},
		{"read in background", SessionExecArgs{Cmd: "true", Background: true, ReadFiles: []string{"/a"}}, "read_files: reads after the command"},
		{"stdin over 4 MiB", SessionExecArgs{Cmd: "true", Stdin: strings.Repeat("x", 4<<20+1)}, "stdin: is 4194305 bytes"},
		{"env name", SessionExecArgs{Cmd: "true", Env: map[string]string{"A=B": "x"}}, "env: the name"},
	} {
		call, puts, err := execCall(c.in)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: %v", c.name, err)
		case c.want != "" && (err == nil || !strings.HasPrefix(err.Error(), c.want) || !errors.Is(err, errdefs.ErrInvalidArgument)):
			t.Errorf("%s: %v; want %q...", c.name, err, c.want)
		case c.want == "" && (len(puts) != 16 || puts[0].Mode != 0o644 || call.Argv[0] != "true" || !call.Shell):
			t.Errorf("%s: call %+v, %d puts", c.name, call, len(puts))
		}
	}
	_, puts, err := execCall(SessionExecArgs{Cmd: "true", WriteFiles: []WriteFileArg{
		{Path: "/b", Content: base64.StdEncoding.EncodeToString([]byte{0, 0xff}), Encoding: "base64", Mode: 0o755}}})
	if err != nil || string(puts[0].Data) != "\x00\xff" || puts[0].Mode != 0o755 {
		t.Errorf("a base64 file: %+v, %v", puts, err)
	}
}

func make16(p string) []string {
	out := make([]string, 16)
	for i := range out {
		out[i] = p
	}
	return out
}

// TestSessionStopOver: stopping a session that is over answers how it
// ended, without calling its (gone) supervisor.
func TestSessionStopOver(t *testing.T) {
	sc, _ := testSessions(t, nil)
	id := newRecord(t, sc, "done", "")
	rec, err := sc.Store.Read(id)
	if err != nil {
		t.Fatal(err)
	}
	rec.State, rec.Reason, rec.Stopped = sess.StateStopped, "idle for 600 s", rec.Created.Add(90*time.Second)
	if err := sc.Store.Write(rec); err != nil {
		t.Fatal(err)
	}
	s := connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true})
	res := s.call(t, context.Background(), ToolSessionStop, map[string]any{"session_id": "done"}, nil)
	var out SessionStopResult
	if err := json.Unmarshal([]byte(resultText(res)), &out); err != nil || res.IsError ||
		out.State != sess.StateStopped || out.Reason != "idle for 600 s" || out.LifetimeS != 90 {
		t.Errorf("session_stop of a stopped session: %s", resultText(res))
	}
}
