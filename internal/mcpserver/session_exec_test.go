package mcpserver

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/errdefs"
	"isopod/internal/report"
	sess "isopod/internal/session"
	"isopod/internal/session/supervisor"
)

// fakeSupervisor serves a session's control socket as a supervisor
// would, over a map of guest files: put stores, get reads, exec answers
// the files' count and records the calls in order.
type fakeSupervisor struct {
	mu    sync.Mutex
	files map[string][]byte
	ops   []string
	hold  time.Duration // how long an exec takes
}

// startFakeSupervisor makes a live session named name in sc and serves
// its socket until the test ends.
func startFakeSupervisor(t *testing.T, sc *SessionConfig, name string) (*fakeSupervisor, string) {
	t.Helper()
	rec, err := sc.Store.Create(name, sess.Spec{Base: "base-min"}, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", rec.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	f := &fakeSupervisor{files: map[string][]byte{}}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go f.serve(conn, rec.ID)
		}
	}()
	return f, rec.ID
}

func (f *fakeSupervisor) serve(conn net.Conn, id string) {
	defer conn.Close()
	c, err := sess.ReadCall(conn)
	if err != nil {
		sess.WriteAnswer(conn, nil, err)
		return
	}
	f.mu.Lock()
	f.ops = append(f.ops, c.Op)
	f.mu.Unlock()
	switch c.Op {
	case sess.OpPut:
		if strings.HasSuffix(c.Path, "/") {
			sess.WriteAnswer(conn, nil, errdefs.ErrInvalidArgument)
			return
		}
		f.mu.Lock()
		f.files[c.Path] = c.Data
		f.mu.Unlock()
		n := int64(len(c.Data))
		sess.WriteAnswer(conn, sess.Reply{OK: true, SessionID: id, Bytes: &n}, nil)
	case sess.OpGet:
		f.mu.Lock()
		data, ok := f.files[c.Path]
		f.mu.Unlock()
		if !ok {
			sess.WriteAnswer(conn, nil, errdefs.ErrNotFound)
			return
		}
		sess.WriteAnswer(conn, supervisor.GetResult{OK: true, Path: c.Path, Mode: 0o644, Data: data}, nil)
	case sess.OpExec:
		if c.Detach {
			sess.WriteAnswer(conn, sess.Reply{OK: true, SessionID: id, JobID: "job-1"}, nil)
			return
		}
		time.Sleep(f.hold)
		code := 0
		out := c.Argv[0] + "|" + strings.Join(c.Env, ",")
		sess.WriteAnswer(conn, struct {
			*supervisor.ExecReport
			SessionID string `json:"session_id"`
		}{&supervisor.ExecReport{OK: true, Argv: c.Argv, Outcome: report.Outcome{ExitCode: &code, Stdout: out, StdoutBytes: int64(len(out))}, ExecMS: 7}, id}, nil)
	case sess.OpJob:
		sess.WriteAnswer(conn, supervisor.JobReport{OK: true, SessionID: id, Job: map[string]any{"id": c.Job, "killed": c.Kill, "wait_s": c.WaitS}, Stdout: "out"}, nil)
	case sess.OpExpose:
		sess.WriteAnswer(conn, sess.Reply{OK: true, SessionID: id, GuestPort: c.GuestPort, HostPort: 4242, Address: "127.0.0.1:4242"}, nil)
	default:
		sess.WriteAnswer(conn, nil, errdefs.ErrNotSupported)
	}
}

func (f *fakeSupervisor) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.ops...)
}

// TestSessionExecFlow: session_exec puts write_files, runs cmd under the
// shell with its env, reads read_files back inline within 4 MiB
// together, says progress while it runs, and starts a background job.
func TestSessionExecFlow(t *testing.T) {
	t.Parallel()
	sc, _ := testSessions(t, nil)
	f, id := startFakeSupervisor(t, sc, "web")
	f.hold = 300 * time.Millisecond
	s := connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true, ProgressInterval: 50 * time.Millisecond})
	big := strings.Repeat("b", 3<<20)
	f.files["/big1"], f.files["/big2"] = []byte(big), []byte(big)
	res := s.call(t, context.Background(), ToolSessionExec, map[string]any{"session_id": "web", "cmd": "make", "env": map[string]any{"A": "1"},
		"write_files": []any{map[string]any{"path": "/w", "content": "hi"}},
		"read_files":  []any{"/w", "/big1", "/big2", "/missing"}}, "tok")
	var out SessionExecResult
	decodeResult(t, res, &out)
	if out.SessionID != id || out.Outcome == nil || out.Stdout != "make|A=1" || *out.DurationMS != 7 || out.Resumed {
		t.Errorf("result: %s", resultText(res))
	}
	if got := f.calls(); strings.Join(got, " ") != "put exec get get get get" {
		t.Errorf("calls %v; want put, exec, then the four gets", got)
	}
	if len(out.Files) != 3 || out.Files[0].Content != "hi" || out.Files[1].Truncated || !out.Files[2].Truncated ||
		len(out.Files[2].Content) != MaxReadFilesInline-2-(3<<20) || out.Files[2].Bytes != 3<<20 {
		t.Errorf("files: %d, first %+v", len(out.Files), out.Files[0])
	}
	if len(out.Warnings) != 1 || !strings.Contains(out.Warnings[0], "read_files[3] /missing") {
		t.Errorf("warnings: %v", out.Warnings)
	}
	if msgs := progressMessages(s); len(msgs) == 0 || !strings.HasPrefix(msgs[0], "session_exec in progress") {
		t.Errorf("progress: %v", msgs)
	}

	res = s.call(t, context.Background(), ToolSessionExec, map[string]any{"session_id": id, "cmd": "serve", "background": true}, nil)
	if text := resultText(res); res.IsError || !strings.Contains(text, `"job_id":"job-1"`) || strings.Contains(text, "exit_code") {
		t.Errorf("background: %s", text)
	}
	res = s.call(t, context.Background(), ToolSessionExec, map[string]any{"session_id": id, "cmd": "true",
		"write_files": []any{map[string]any{"path": "/dir/", "content": "x"}}}, nil)
	if text := resultText(res); !res.IsError || !strings.Contains(text, `write_files[0] "/dir/"`) || !strings.Contains(text, "cmd did not run") {
		t.Errorf("a failed write: %s", text)
	}
	if got := f.calls(); got[len(got)-1] != sess.OpPut {
		t.Errorf("cmd ran after a failed write: %v", got)
	}
}

// decodeResult decodes a tool's result into v; a tool error fails the
// test.
func decodeResult(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", resultText(res))
	}
	if err := json.Unmarshal([]byte(resultText(res)), v); err != nil {
		t.Fatal(err)
	}
}

// progressMessages drains the progress notifications s got so far.
func progressMessages(s *session) []string {
	var out []string
	for {
		select {
		case p := <-s.progress:
			out = append(out, p.Message)
		default:
			return out
		}
	}
}

// TestSessionJobAndExpose: session_job and session_expose pass their
// arguments to the supervisor and answer without its ok.
func TestSessionJobAndExpose(t *testing.T) {
	sc, _ := testSessions(t, nil)
	_, id := startFakeSupervisor(t, sc, "jobs")
	s := connect(t, Config{Core: &scriptedCore{}, Sessions: sc, NoStartupGC: true})
	var job SessionJobResult
	decodeResult(t, s.call(t, context.Background(), ToolSessionJob, map[string]any{"session_id": "jobs", "job_id": "job-1", "wait_s": 5, "kill": true}, nil), &job)
	if j, _ := job.Job.(map[string]any); job.SessionID != id || job.Stdout != "out" || j["id"] != "job-1" || j["killed"] != true || j["wait_s"] != float64(5) {
		t.Errorf("session_job: %+v", job)
	}
	res := s.call(t, context.Background(), ToolSessionJob, map[string]any{"session_id": "jobs", "job_id": "j", "wait_s": 3601}, nil)
	if text := resultText(res); !res.IsError || !strings.HasPrefix(text, "session_job refused: wait_s: must be between 0 and 3600") {
		t.Errorf("wait_s past its bound: %s", text)
	}
	var ex SessionExposeResult
	decodeResult(t, s.call(t, context.Background(), ToolSessionExpose, map[string]any{"session_id": id, "guest_port": 8000}, nil), &ex)
	if ex.Address != "127.0.0.1:4242" || ex.GuestPort != 8000 {
		t.Errorf("session_expose: %+v", ex)
	}
	res = s.call(t, context.Background(), ToolSessionExpose, map[string]any{"session_id": id, "guest_port": 70000}, nil)
	if text := resultText(res); !res.IsError || !strings.HasPrefix(text, "session_expose refused: guest_port") {
		t.Errorf("a port past 65535: %s", text)
	}
}
