package mcpserver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"isopod/internal/hostio/hostiotest"
	"isopod/internal/report"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/config"
	"isopod/internal/knobs"
	"isopod/internal/sandbox"
	"isopod/internal/stages"
)

// The test binary doubles as the server: with serveEnv=1, TestMain serves
// MCP on stdio instead of running tests, exactly as cmd/isopod-mcp does.
const (
	serveEnv      = "ISOPOD_MCP_TEST_SERVE"
	progressMSEnv = "ISOPOD_MCP_TEST_PROGRESS_MS"
	// holdEnv=1: every sandbox_run runs until it is cancelled, no VM
	// started (the rest of the core is the real one).
	holdEnv = "ISOPOD_MCP_TEST_HOLD_RUNS"
)

func serveForTest() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	tweak := func(c *Config) {
		if ms, err := strconv.Atoi(os.Getenv(progressMSEnv)); err == nil && ms > 0 {
			c.ProgressInterval = time.Duration(ms) * time.Millisecond
		}
		if os.Getenv(holdEnv) == "1" {
			c.Core = holdRuns{c.Core}
		}
	}
	return mainWith(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, os.LookupEnv, "test", tweak)
}

// holdRuns is a core whose runs last until they are cancelled.
type holdRuns struct{ Core }

func (holdRuns) Run(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// lockedBuffer collects a subprocess's stderr.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// stdioServer is the server as a real subprocess, with a client on its
// stdin/stdout.
type stdioServer struct {
	session
	cmd    *exec.Cmd
	stderr *lockedBuffer
}

// serverCommand re-executes the test binary as the server, in dir, with the
// given environment on top of this process's.
func serverCommand(dir string, env map[string]string) *exec.Cmd {
	cmd := exec.Command(serverBin)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), serveEnv+"=1")
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	return cmd
}

func startStdio(t *testing.T, dir string, env map[string]string) *stdioServer {
	t.Helper()
	s := &stdioServer{cmd: serverCommand(dir, env), stderr: &lockedBuffer{}}
	s.cmd.Stderr = s.stderr
	s.progress = make(chan *mcp.ProgressNotificationParams, 1000)
	client := mcp.NewClient(&mcp.Implementation{Name: "isopod-e2e", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			s.progress <- r.Params
		},
	})
	cs, err := client.Connect(context.Background(), &mcp.CommandTransport{Command: s.cmd, TerminateDuration: 5 * time.Second}, nil)
	if err != nil {
		t.Fatalf("connecting to the server: %v\nstderr:\n%s", err, s.stderr)
	}
	s.cs = cs
	t.Cleanup(func() {
		pid := s.cmd.Process.Pid
		cs.Close()
		// Whatever happened, no VMM the server started may outlive the test.
		for _, p := range qemuDescendants(pid) {
			syscall.Kill(p, syscall.SIGKILL)
		}
		if t.Failed() {
			t.Logf("server stderr:\n%s", s.stderr)
		}
	})
	return s
}

func TestStdioServer(t *testing.T) {
	h := newHostTree(t)
	s := startStdio(t, h.Root, map[string]string{knobs.Home: h.Home})
	ctx := context.Background()

	res, err := s.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Tools) != len(ToolNames) {
		t.Errorf("listed %d tools, want %d", len(res.Tools), len(ToolNames))
	}
	for _, tl := range res.Tools {
		if tl.Name == ToolSandboxRun {
			req, _ := tl.InputSchema.(map[string]any)["required"].([]any)
			if len(req) != 1 || req[0] != "cmd" {
				t.Errorf("sandbox_run required = %v", req)
			}
		}
	}
	if line := "host file I/O: confined to " + h.Root; !strings.Contains(s.stderr.String(), line) {
		t.Errorf("stderr lacks the policy line %q:\n%s", line, s.stderr)
	}

	// Each attack is refused and leaves its destination untouched.
	attacks := []struct {
		name string
		args map[string]any
		want string
	}{
		{"dotdot", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "../outside/secret.txt"}}}, knobs.MCPHostIORoot},
		{"absolute outside", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": h.Secret}}}, h.Root},
		{"symlink out", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "out-link"}}}, h.Root},
		{"dangling link/", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "in-dangling/"}}}, "does not resolve"},
		{"link pointing out, dangling", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "dangling/"}}}, "outside the host-I/O root"},
		{"state dir", map[string]any{"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": filepath.Join(h.Home, "credentials.json")}}}, "state directory"},
		{"stdin FIFO", map[string]any{"stdin_file": "fifo"}, "a FIFO"},
		{"stdin 5 MiB", map[string]any{"stdin_file": "big"}, "4 MiB"},
		{"stdin outside", map[string]any{"stdin_file": "../outside/secret.txt"}, h.Root},
	}
	for _, a := range attacks {
		t.Run(a.name, func(t *testing.T) {
			args := map[string]any{"cmd": "cat", "network": false}
			for k, v := range a.args {
				args[k] = v
			}
			before := hostiotest.Snapshot(t, h.Outside)
			cred, _ := os.ReadFile(filepath.Join(h.Home, "credentials.json"))
			r := s.call(t, ctx, ToolSandboxRun, args, nil)
			hostiotest.SameSnapshot(t, before, hostiotest.Snapshot(t, h.Outside))
			if after, _ := os.ReadFile(filepath.Join(h.Home, "credentials.json")); !bytes.Equal(cred, after) {
				t.Error("credentials.json changed")
			}
			if !r.IsError || !strings.Contains(resultText(r), a.want) {
				t.Errorf("result (error %v) %q lacks %q", r.IsError, resultText(r), a.want)
			}
		})
	}
}

func TestStdioCopyOutOff(t *testing.T) {
	h := newHostTree(t)
	s := startStdio(t, h.Root, map[string]string{knobs.Home: h.Home, knobs.MCPCopyOut: "off"})
	if !strings.Contains(s.stderr.String(), "copy_out=off") {
		t.Errorf("policy line does not say copy_out=off:\n%s", s.stderr)
	}
	before := hostiotest.Snapshot(t, h.Root)
	r := s.call(t, context.Background(), ToolSandboxRun, map[string]any{"cmd": "true",
		"copy_out": []map[string]string{{"guest": "/etc/hostname", "host": "new.txt"}}}, nil)
	if !r.IsError || !strings.Contains(resultText(r), knobs.MCPCopyOut+"=off") {
		t.Errorf("copy_out with %s=off: %q", knobs.MCPCopyOut, resultText(r))
	}
	after := hostiotest.Snapshot(t, h.Root)
	if _, ok := after[filepath.Join(h.Root, "new.txt")]; ok {
		t.Error("new.txt was created")
	}
	for k, v := range before {
		if after[k] != v && !strings.HasPrefix(k, h.Home) {
			t.Errorf("%s changed", k)
		}
	}
}

// vmBase returns a built, current base from the state root the environment
// names (the private one TestMain links to the user's images), or skips.
func vmBase(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("boots microVMs; skipped under -short")
	}
	base, why := findVMBase()
	if base == "" {
		t.Skip(why)
	}
	return base
}

// findVMBase returns a built, current base, or "" and why there is none.
func findVMBase() (base, why string) {
	settings, err := config.Load(os.LookupEnv)
	if err != nil {
		return "", fmt.Sprintf("no settings: %v", err)
	}
	paths := settings.Paths
	res, err := stages.New(stages.Options{Settings: settings.Settings}).ImageList(context.Background())
	if err != nil {
		return "", fmt.Sprintf("cannot list images under %s (%v); build the kernel and images first", paths.Home, err)
	}
	for _, want := range []string{DefaultBase, "base-min"} {
		for _, im := range res.Images {
			if im.Flavor == want && im.Built && !im.Stale {
				return want, ""
			}
		}
	}
	return "", fmt.Sprintf("no base is built under %s; build the images first (isopod image ls)", paths.Home)
}

func reportOf(t *testing.T, r *mcp.CallToolResult) RunResult {
	t.Helper()
	if r.IsError {
		t.Fatalf("tool error: %s", resultText(r))
	}
	var rep RunResult
	raw, _ := json.Marshal(r.StructuredContent)
	if err := json.Unmarshal(raw, &rep); err != nil {
		t.Fatalf("report: %v (%s)", err, raw)
	}
	return rep
}

func TestVMRunEchoStdinCopyOut(t *testing.T) {
	base := vmBase(t)
	root := t.TempDir()
	hostiotest.MustWrite(t, filepath.Join(root, "in.txt"), "from the host\n")
	s := startStdio(t, root, nil)
	r := s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": "echo hi && cat > /tmp/o", "base": base, "network": false,
		"stdin_file": "in.txt",
		"copy_out":   []map[string]string{{"guest": "/tmp/o", "host": "out/o.txt"}},
	}, nil)
	rep := reportOf(t, r)
	if rep.ExitCode == nil || *rep.ExitCode != 0 || rep.Stdout != "hi\n" {
		t.Fatalf("exit %v stdout %q stderr %q", rep.ExitCode, rep.Stdout, rep.Stderr)
	}
	got, err := os.ReadFile(filepath.Join(root, "out", "o.txt"))
	if err != nil || string(got) != "from the host\n" {
		t.Errorf("copied file = %q, %v", got, err)
	}
}

func TestVMCommitThenFork(t *testing.T) {
	base := vmBase(t)
	s := startStdio(t, t.TempDir(), nil)
	ctx := context.Background()
	label := fmt.Sprintf("mcptest/fork-%d-%d", os.Getpid(), time.Now().UnixNano()%1e6)
	r := s.call(t, ctx, ToolSandboxRun, map[string]any{
		"cmd": "mkdir -p /root && echo layered > /root/marker", "base": base, "network": false, "commit_as": label,
	}, nil)
	rep := reportOf(t, r)
	if rep.StageID == "" {
		t.Fatalf("no stage committed: %+v", rep)
	}
	t.Cleanup(func() { s.call(t, ctx, ToolStageRm, map[string]any{"reference": label}, nil) })

	info := s.call(t, ctx, ToolStageInfo, map[string]any{"reference": label}, nil)
	if info.IsError || !strings.Contains(resultText(info), rep.StageID) {
		t.Errorf("stage_info: %s", resultText(info))
	}
	fork := reportOf(t, s.call(t, ctx, ToolSandboxRun, map[string]any{
		"cmd": "cat /root/marker", "stage": label, "network": false,
	}, nil))
	if fork.Stdout != "layered\n" {
		t.Errorf("fork read %q (stderr %q)", fork.Stdout, fork.Stderr)
	}
}

func TestVMProgressOnLongRun(t *testing.T) {
	base := vmBase(t)
	s := startStdio(t, t.TempDir(), map[string]string{progressMSEnv: "1000"})
	start := time.Now()
	rep := reportOf(t, s.call(t, context.Background(), ToolSandboxRun, map[string]any{
		"cmd": "sleep 4", "base": base, "network": false,
	}, "long-run"))
	if rep.ExitCode == nil || *rep.ExitCode != 0 {
		t.Fatalf("exit %v", rep.ExitCode)
	}
	elapsed := time.Since(start)
	n := len(s.progress)
	// One at the start and one a second after, for at least 4 s.
	if n < 4 {
		t.Errorf("%d progress notifications in %v at a 1 s interval", n, elapsed)
	}
}

func TestVMCancellationLeavesNoQEMU(t *testing.T) {
	base := vmBase(t)
	s := startStdio(t, t.TempDir(), nil)
	pid := s.cmd.Process.Pid
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: ToolSandboxRun,
			Arguments: map[string]any{"cmd": "sleep 600", "base": base, "network": false}})
		done <- err
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for len(qemuDescendants(pid)) == 0 {
		select {
		case err := <-done:
			t.Fatalf("the run ended before a QEMU process appeared: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("no QEMU process appeared under the server within 2 minutes")
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Let the guest get as far as running the command.
	time.Sleep(2 * time.Second)
	// The run's VMM; the server may start others of its own afterwards (a
	// background snapshot build, ready VMs), which end with it.
	victims := qemuDescendants(pid)
	cancel()
	<-done
	deadline = time.Now().Add(30 * time.Second)
	for {
		left := slices.DeleteFunc(slices.Clone(victims), func(p int) bool { return !slices.Contains(qemuDescendants(pid), p) })
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("QEMU processes %v still running 30 s after cancellation", left)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// qemuDescendants lists the QEMU processes below pid.
func qemuDescendants(pid int) []int {
	children := map[int][]int{}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// The parent pid follows the parenthesised command name.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		if pp, err := strconv.Atoi(f[1]); err == nil {
			children[pp] = append(children[pp], p)
		}
	}
	var out []int
	queue := []int{pid}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for _, c := range children[p] {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", c))
			if strings.Contains(string(comm), "qemu") {
				out = append(out, c)
			}
			queue = append(queue, c)
		}
	}
	return out
}
