package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// streamCore's sandbox_run sleeps for "sleep N" and otherwise runs until
// it is cancelled; it records how each run ended.
type streamCore struct {
	scriptedCore
	mu    sync.Mutex
	ended []error
}

func newStreamCore() *streamCore {
	c := &streamCore{}
	c.run = func(ctx context.Context, req sandbox.Request) (*report.Run, error) {
		var d time.Duration = time.Hour
		if n, ok := strings.CutPrefix(req.Argv[2], "sleep "); ok {
			s, _ := strconv.Atoi(n)
			d = time.Duration(s) * time.Second
		}
		select {
		case <-time.After(d):
			c.record(nil)
			code := 0
			return &report.Run{OK: true, VMID: "vm-test", Outcome: report.Outcome{ExitCode: &code, Stdout: "slept\n"}, Path: "cold"}, nil
		case <-ctx.Done():
			c.record(ctx.Err())
			return nil, ctx.Err()
		}
	}
	return c
}

func (c *streamCore) record(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ended = append(c.ended, err)
}

func (c *streamCore) endings() []error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]error(nil), c.ended...)
}

// TestTypeScriptClientHTTPStreams drives the server's call streams with
// the official TypeScript SDK's client (test/mcp-interop/http-streams.mjs;
// npm ci there first): a call whose connection drops is resumed with
// Last-Event-ID and gets its result, the run having gone on; a call the
// client aborts is cancelled and gets nothing; a call in flight when the
// server stops gets a JSON-RPC error saying so, and the server stops.
func TestTypeScriptClientHTTPStreams(t *testing.T) {
	t.Parallel()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	dir := interopDir(t)
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@modelcontextprotocol", "sdk")); err != nil {
		t.Skipf("the TypeScript SDK is not installed; run npm ci in %s", dir)
	}
	core := newStreamCore()
	h := startHTTP(t, Config{Core: core, ProgressInterval: time.Hour}, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, filepath.Join(dir, "http-streams.mjs"), h.url, runToken)
	cmd.Dir = dir
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var logged []string
	var stopped time.Time
	sc := bufio.NewScanner(stderr)
	for sc.Scan() {
		logged = append(logged, sc.Text())
		if sc.Text() == "ready" && stopped.IsZero() {
			stopped = time.Now()
			h.stop()
		}
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("node: %v\n%s", err, strings.Join(logged, "\n"))
	}
	var out struct {
		Resume struct {
			IsError     bool
			Structured  RunResult
			Error       string
			Dropped     bool
			ResumedWith [][2]any
		}
		Cancel struct {
			Error       string
			StreamEnded bool
			ResumeEnded *bool
			Answers     int
			Body        string
		}
		Shutdown struct {
			Completed bool
			Error     string
			Code      float64
		}
		ClientErrors []string
	}
	if err := json.Unmarshal(stdout.Bytes(), &out); err != nil {
		t.Fatalf("%v: %s\n%s", err, stdout.String(), strings.Join(logged, "\n"))
	}
	r := out.Resume
	if r.IsError || r.Error != "" || r.Structured.Stdout != "slept\n" || !r.Dropped || len(r.ResumedWith) == 0 {
		t.Errorf("a call whose connection dropped: %+v", r)
	}
	c := out.Cancel
	if c.Error == "completed" || !c.StreamEnded || c.ResumeEnded == nil || !*c.ResumeEnded || c.Answers != 0 {
		t.Errorf("a call the client aborted: %+v", c)
	}
	s := out.Shutdown
	if stopped.IsZero() || s.Completed || !strings.Contains(s.Error, "shutting down") || s.Code != codeShuttingDown {
		t.Errorf("a call in flight when the server stopped: %+v", s)
	}
	select {
	case err := <-h.served:
		if err != nil {
			t.Errorf("Serve: %v", err)
		}
		if d := time.Since(stopped); d > 5*time.Second {
			t.Errorf("the server stopped %v after it was told to", d)
		}
	case <-time.After(10 * time.Second):
		t.Error("the server did not stop")
	}
	ended := core.endings()
	if len(ended) != 3 || ended[0] != nil || !errors.Is(ended[1], context.Canceled) || !errors.Is(ended[2], context.Canceled) {
		t.Errorf("the runs ended with %v; want the resumed one finished, the others cancelled", ended)
	}
}
