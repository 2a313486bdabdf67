package agent

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

func TestExec(t *testing.T) {
	c := startAgent(t, Options{})
	dir := t.TempDir()
	tests := []struct {
		name       string
		exec       agentproto.Exec
		stdout     string
		stderr     string
		code       int
		signal     int
		stdoutPart string
	}{
		{name: "echo", exec: agentproto.Exec{Argv: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "exit 1", exec: agentproto.Exec{Argv: []string{"sh", "-c", "exit 1"}}, code: 1},
		{name: "exit 42", exec: agentproto.Exec{Argv: []string{"sh", "-c", "exit 42"}}, code: 42},
		{name: "stderr", exec: agentproto.Exec{Argv: []string{"sh", "-c", "echo out; echo err >&2"}}, stdout: "out\n", stderr: "err\n"},
		{name: "absolute program", exec: agentproto.Exec{Argv: []string{"/bin/sh", "-c", "echo abs"}}, stdout: "abs\n"},
		{name: "cwd", exec: agentproto.Exec{Argv: []string{"pwd"}, Cwd: dir}, stdout: dir + "\n"},
		{name: "default env", exec: agentproto.Exec{Argv: []string{"sh", "-c", `echo "$HOME|$TERM|$LANG|$PATH"`}},
			stdout: "/root|linux|C.UTF-8|" + DefaultPath + "\n"},
		{name: "request env", exec: agentproto.Exec{Argv: []string{"sh", "-c", `echo "$FOO|$HOME"`}, Env: []string{"FOO=a=b", "HOME=/tmp"}},
			stdout: "a=b|/tmp\n"},
		{name: "stdin is /dev/null", exec: agentproto.Exec{Argv: []string{"cat"}}, stdout: ""},
		{name: "killed by a signal", exec: agentproto.Exec{Argv: []string{"sh", "-c", "kill -TERM $$"}}, signal: int(unix.SIGTERM)},
		{name: "own process group", exec: agentproto.Exec{Argv: []string{"sh", "-c", `ps -o pgid= -p $$ | tr -d ' '; echo $$`}}, stdoutPart: "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.exec(tt.exec)
			if tt.signal != 0 {
				if r.done.Signal == nil || *r.done.Signal != tt.signal || r.done.ExitCode != nil {
					t.Errorf("done = %+v; want signal %d", r.done, tt.signal)
				}
				return
			}
			if r.code() != tt.code {
				t.Errorf("exit code %d; want %d (stderr %q)", r.code(), tt.code, r.stderr)
			}
			if tt.name == "own process group" {
				f := strings.Fields(string(r.stdout))
				if len(f) != 2 || f[0] != f[1] {
					t.Errorf("pgid and pid: %q; want equal", r.stdout)
				}
				return
			}
			if string(r.stdout) != tt.stdout || string(r.stderr) != tt.stderr {
				t.Errorf("stdout %q stderr %q; want %q and %q", r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
			if r.done.TimedOut || r.done.DurationMS < 0 {
				t.Errorf("done = %+v", r.done)
			}
		})
	}
}

func TestExecCannotStart(t *testing.T) {
	c := startAgent(t, Options{})
	dir := t.TempDir()
	plain := filepath.Join(dir, "plain")
	if err := os.WriteFile(plain, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		exec   agentproto.Exec
		stderr string
	}{
		{"missing program", agentproto.Exec{Argv: []string{"nosuchprog-isopod"}}, "isopod: nosuchprog-isopod: command not found\n"},
		{"missing path", agentproto.Exec{Argv: []string{"/nonexistent/prog"}}, "isopod: /nonexistent/prog: no such file or directory\n"},
		{"missing cwd", agentproto.Exec{Argv: []string{"true"}, Cwd: "/nope-isopod"}, "isopod: cwd /nope-isopod: no such directory\n"},
		{"cwd is a file", agentproto.Exec{Argv: []string{"true"}, Cwd: plain}, "isopod: cwd " + plain + ": not a directory\n"},
		{"not executable", agentproto.Exec{Argv: []string{plain}}, "isopod: " + plain + ": permission denied (not executable)\n"},
		{"relative not executable", agentproto.Exec{Argv: []string{"./plain"}, Cwd: dir}, "isopod: ./plain: permission denied (not executable)\n"},
		{"directory", agentproto.Exec{Argv: []string{dir}}, "isopod: " + dir + ": is a directory\n"},
		{"not executable in PATH", agentproto.Exec{Argv: []string{"plain"}, Env: []string{"PATH=" + dir}}, "isopod: " + plain + ": permission denied (not executable)\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := c.exec(tt.exec)
			if r.code() != 127 || string(r.stderr) != tt.stderr || len(r.stdout) != 0 {
				t.Errorf("got code %d stderr %q; want 127 and %q", r.code(), r.stderr, tt.stderr)
			}
		})
	}
}

func TestExecLargeOutput(t *testing.T) {
	c := startAgent(t, Options{})
	data := make([]byte, 300<<10+123)
	rand.Read(data)
	f := filepath.Join(t.TempDir(), "data")
	if err := os.WriteFile(f, data, 0o644); err != nil {
		t.Fatal(err)
	}
	r := c.exec(agentproto.Exec{Argv: []string{"cat", f}})
	if r.code() != 0 || !bytes.Equal(r.stdout, data) {
		t.Fatalf("got code %d and %d bytes; want 0 and the %d bytes of the file", r.code(), len(r.stdout), len(data))
	}
	id := c.wire.lastSent(t, agentproto.KindExec)
	for _, f := range c.wire.frames(id) {
		if n := len(f.p); f.m.Kind == agentproto.KindOutput && (n > agentproto.ChunkSize || n == 0) {
			t.Fatalf("an output frame carries %d bytes; want 1..%d", n, agentproto.ChunkSize)
		}
	}
}

// procEntry is one process as /proc/PID/stat describes it.
type procEntry struct {
	pid, comm string
	fields    []string // from field 3 (state) on
}

// procs lists the processes in /proc.
func procs() []procEntry {
	ents, _ := os.ReadDir("/proc")
	var out []procEntry
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		end := strings.LastIndexByte(s, ')') + 1
		out = append(out, procEntry{pid: e.Name(), comm: s[:end], fields: strings.Fields(s[end:])})
	}
	return out
}

// groupAlive lists processes of process group pgid that have not exited.
func groupAlive(t *testing.T, pgid int) []string {
	t.Helper()
	var alive []string
	for _, p := range procs() {
		if len(p.fields) > 2 && p.fields[2] == strconv.Itoa(pgid) && p.fields[0] != "Z" {
			alive = append(alive, p.pid+":"+p.comm)
		}
	}
	return alive
}

func TestExecTimeout(t *testing.T) {
	c := startAgent(t, Options{})
	start := time.Now()
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", "echo $$; sleep 1000 & sleep 1000"}, TimeoutMS: 300})
	took := time.Since(start)
	if took > 2*time.Second {
		t.Errorf("a 300 ms timeout took %s", took)
	}
	if !r.done.TimedOut || r.done.Signal == nil || *r.done.Signal != int(unix.SIGKILL) {
		t.Errorf("done = %+v; want timed out and killed", r.done)
	}
	pgid, err := strconv.Atoi(strings.TrimSpace(string(r.stdout)))
	if err != nil {
		t.Fatalf("stdout %q: want the shell's pid", r.stdout)
	}
	var alive []string
	for i := 0; i < 40; i++ {
		if alive = groupAlive(t, pgid); len(alive) == 0 {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Errorf("processes of group %d still alive after the timeout: %v", pgid, alive)
}

func TestExecSignal(t *testing.T) {
	c := startAgent(t, Options{})
	res := c.startExec(agentproto.Exec{Argv: []string{"sh", "-c", "echo ready; sleep 1000"}})
	// SIGTERM, not SIGINT: a test run from a shell without job control
	// inherits SIGINT ignored, and so would the exec. The client has no
	// call for a signal: it is written raw.
	c.sendRaw(&agentproto.Msg{ID: c.wire.lastSent(t, agentproto.KindExec), Kind: agentproto.KindSignal, Signal: int(unix.SIGTERM)}, nil)
	r := <-res
	if r.err != nil || r.signal() != int(unix.SIGTERM) || r.done.TimedOut {
		t.Errorf("done = %+v, %v; want ended by SIGTERM", r.done, r.err)
	}
}

// A process that leaves its group (setsid) and keeps stdout open must not
// hold ExecDone back for more than the drain grace.
func TestExecEscapedGrandchild(t *testing.T) {
	if _, err := os.Stat("/usr/bin/setsid"); err != nil {
		t.Skip("setsid(1) is not installed")
	}
	c := startAgent(t, Options{})
	pidFile := filepath.Join(t.TempDir(), "pid")
	t.Cleanup(func() {
		for i := 0; i < 50; i++ {
			if b, err := os.ReadFile(pidFile); err == nil && len(b) > 0 {
				if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
					unix.Kill(pid, unix.SIGKILL)
				}
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	start := time.Now()
	script := fmt.Sprintf(`setsid sh -c 'echo $$ > %s; exec sleep 30' & sleep 0.1; echo started`, pidFile)
	r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", script}})
	if took := time.Since(start); took > time.Second+100*time.Millisecond {
		t.Errorf("ExecDone took %s; want under ~1 s", took)
	}
	if r.code() != 0 || string(r.stdout) != "started\n" {
		t.Errorf("got code %d stdout %q", r.code(), r.stdout)
	}
}

func TestExecStdin(t *testing.T) {
	c := startAgent(t, Options{})
	data := make([]byte, 1<<20)
	rand.Read(data)
	r := c.execWith(agentproto.Exec{Argv: []string{"sha256sum"}}, bytes.NewReader(data), nil)
	sum := sha256.Sum256(data)
	if r.err != nil || r.code() != 0 || !strings.HasPrefix(string(r.stdout), hex.EncodeToString(sum[:])) {
		t.Errorf("sha256sum said %q (code %d, %v); want %x", r.stdout, r.code(), r.err, sum)
	}
	// The client kept to the window: every stdin frame was acknowledged.
	id := c.wire.lastSent(t, agentproto.KindExec)
	acks := 0
	for _, f := range c.wire.frames(id) {
		if f.m.Kind == agentproto.KindStdinAck {
			acks++
		}
	}
	if want := len(data)/agentproto.ChunkSize + 1; acks < want {
		t.Errorf("%d stdin acks; want at least %d (one per frame and the EOF)", acks, want)
	}
}

func TestExecConcurrent(t *testing.T) {
	c := startAgent(t, Options{})
	order := make(chan string, 2)
	results := make(chan execResult, 2)
	for _, tt := range []struct{ name, script string }{
		{"slow", "sleep 0.5; echo slow"},
		{"fast", "echo fast"},
	} {
		go func() {
			r := c.execWith(agentproto.Exec{Argv: []string{"sh", "-c", tt.script}}, nil, nil)
			order <- tt.name
			results <- r
		}()
	}
	first, second := <-order, <-order
	got := map[string]bool{}
	for range 2 {
		r := <-results
		got[string(r.stdout)] = r.err == nil
	}
	if !got["fast\n"] || !got["slow\n"] {
		t.Errorf("outputs %v; want fast and slow, each its own", got)
	}
	if first != "fast" || second != "slow" {
		t.Errorf("finished %s then %s: they did not run concurrently", first, second)
	}
}

// zeros is an endless stdin.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// An exec that never reads its stdin, with a full window of stdin frames
// pending, must not stall anything else on the connection.
func TestStdinBackpressureDoesNotBlock(t *testing.T) {
	c := startAgent(t, Options{})
	stuck := make(chan execResult, 1)
	go func() { stuck <- c.execWith(agentproto.Exec{Argv: []string{"sleep", "1000"}}, zeros{}, nil) }()
	// Wait until the client has filled the window.
	deadline := time.Now().Add(5 * time.Second)
	for n := 0; n < agentproto.StdinWindow; n = c.wire.countSent(agentproto.KindStdin) {
		if time.Now().After(deadline) {
			t.Fatalf("the client sent %d stdin frames; want a full window of %d", n, agentproto.StdinWindow)
		}
		time.Sleep(10 * time.Millisecond)
	}
	stuckID := c.wire.lastSent(t, agentproto.KindExec)
	start := time.Now()
	r := c.exec(agentproto.Exec{Argv: []string{"echo", "other"}})
	if string(r.stdout) != "other\n" {
		t.Errorf("other exec: %q", r.stdout)
	}
	wantErr(t, c.call(&agentproto.Msg{Kind: agentproto.KindPing}, nil), "")
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("other requests took %s behind a stuck stdin", d)
	}
	c.sendRaw(&agentproto.Msg{ID: stuckID, Kind: agentproto.KindSignal, Signal: int(unix.SIGKILL)}, nil)
	select {
	case rs := <-stuck:
		if rs.err != nil || rs.signal() != int(unix.SIGKILL) {
			t.Errorf("stuck exec ended with %+v, %v; want SIGKILL", rs.done, rs.err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the stuck exec did not end")
	}
}

// A host that ignores the stdin window loses the connection. The client
// keeps to the window, so the exec and its stdin are written raw.
func TestStdinWindowOverrunEndsConnection(t *testing.T) {
	c := startAgent(t, Options{})
	c.rawID++
	id := c.rawID
	c.sendRaw(&agentproto.Msg{ID: id, Kind: agentproto.KindExec, Exec: &agentproto.Exec{Argv: []string{"sleep", "1000"}, Stdin: true}}, nil)
	var b bytes.Buffer
	agentproto.WriteFrame(&b, &agentproto.Msg{ID: id, Kind: agentproto.KindStdin}, make([]byte, agentproto.ChunkSize))
	// The agent stops reading at the violation, so the writes may block:
	// send from a goroutine that the cleanup's close releases.
	go func() {
		for i := 0; i < 4*agentproto.StdinWindow; i++ {
			if _, err := c.wire.writeRaw(b.Bytes()); err != nil {
				return
			}
		}
	}()
	if err := c.serveResult(5 * time.Second); !errors.Is(err, errStdinWindow) {
		t.Errorf("Serve = %v; want a window violation", err)
	}
	done := c.wire.await(t, id, func(f frame) bool { return f.m.Kind == agentproto.KindExecDone }).m.Done
	if done == nil || done.Signal == nil {
		t.Errorf("exec at connection end: %+v; want killed", done)
	}
}

func TestMergeEnv(t *testing.T) {
	got, err := mergeEnv([]string{"A=1", "B=2"}, nil, []string{"B=3", "C=4", "A=5"})
	if err != nil {
		t.Fatal(err)
	}
	if want := "A=5 B=3 C=4"; strings.Join(got, " ") != want {
		t.Errorf("mergeEnv = %v; want %s", got, want)
	}
	if _, err := mergeEnv([]string{"A=1"}, []string{"=bad"}); err == nil {
		t.Error("mergeEnv accepted an entry without a name")
	}
}

// A signal that reaches an exec before its process has started is kept and
// delivered at the start, not dropped.
func TestEarlySignalIsDeliveredAtStart(t *testing.T) {
	st := &execState{id: 1}
	if err := st.signal(unix.SIGTERM); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sleep", "1000")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill() })
	if err := st.started(cmd.Process.Pid); err != nil {
		t.Fatal(err)
	}
	err := cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGTERM {
		t.Fatalf("sleep ended with %v; want SIGTERM", err)
	}
	st.exited()
	if err := st.signal(unix.SIGKILL); err != nil || len(st.pending) != 0 {
		t.Errorf("a signal after the exit: err %v, pending %v; want it dropped", err, st.pending)
	}
}
