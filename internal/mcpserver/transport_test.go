package mcpserver

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// rawSession is a server on StdioTransport with the test writing its
// stdin line by line and reading its stdout.
type rawSession struct {
	in    *io.PipeWriter
	lines chan string
	ran   chan error
}

func startRaw(t *testing.T, core Core) *rawSession {
	t.Helper()
	srv, err := New(Config{Core: core, NoStartupGC: true})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	r := &rawSession{in: inW, lines: make(chan string, 100), ran: make(chan error, 1)}
	go func() { r.ran <- srv.Run(context.Background(), &StdioTransport{Reader: inR, Writer: outW}) }()
	go func() {
		sc := bufio.NewScanner(outR)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			r.lines <- sc.Text()
		}
		close(r.lines)
	}()
	t.Cleanup(func() {
		inW.Close()
		select {
		case <-r.ran:
		case <-time.After(10 * time.Second):
			t.Error("the server did not end when its stdin closed")
		}
		outW.Close()
	})
	return r
}

func (r *rawSession) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// recv returns the next message the server wrote.
func (r *rawSession) recv(t *testing.T) map[string]any {
	t.Helper()
	select {
	case line, ok := <-r.lines:
		if !ok {
			t.Fatal("the server closed its stdout")
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("the server wrote a line that is not JSON: %q", line)
		}
		return m
	case <-time.After(10 * time.Second):
		t.Fatal("no answer from the server within 10 s")
	}
	return nil
}

// quiet fails if the server writes anything within d.
func (r *rawSession) quiet(t *testing.T, d time.Duration) {
	t.Helper()
	select {
	case line := <-r.lines:
		t.Errorf("the server wrote %q", line)
	case <-time.After(d):
	}
}

func errCode(m map[string]any) float64 {
	e, _ := m["error"].(map[string]any)
	c, _ := e["code"].(float64)
	return c
}

const initLine = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`

// TestBadLinesKeepTheSession: every malformed line gets a JSON-RPC error
// and the session goes on.
func TestBadLinesKeepTheSession(t *testing.T) {
	r := startRaw(t, &scriptedCore{})
	for _, tt := range []struct {
		line string
		code float64
		id   any // want id, nil for null
	}{
		{`{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, -32600, float64(2)}, // before initialize
		{`{bad json`, -32700, nil},
		{`[{"jsonrpc":"2.0","id":3,"method":"ping"}]`, -32600, nil},
		{`{"jsonrpc":"1.0","id":4,"method":"ping"}`, -32600, float64(4)},
		{`{"id":5,"method":"ping"}`, -32600, float64(5)},
		{`{"jsonrpc":"2.0","id":6,"method":7}`, -32600, float64(6)},
		{`{"jsonrpc":"2.0","id":{"x":1},"method":"ping"}`, -32600, nil},
		{`"just a string"`, -32600, nil},
		{`{"jsonrpc":"2.0","id":8}`, -32600, float64(8)},
	} {
		r.send(t, tt.line)
		m := r.recv(t)
		if errCode(m) != tt.code || m["id"] != tt.id {
			t.Errorf("%s: got %v; want code %v and id %v", tt.line, m, tt.code, tt.id)
		}
		if e := m["error"].(map[string]any); len(e["message"].(string)) < 10 {
			t.Errorf("%s: error without a useful message: %v", tt.line, e)
		}
	}
	r.send(t, `{"jsonrpc":"2.0","id":9,"method":"ping"}`) // allowed before initialize
	if m := r.recv(t); m["id"] != float64(9) || m["error"] != nil {
		t.Errorf("ping before initialize: %v", m)
	}
	r.send(t, initLine)
	if m := r.recv(t); m["id"] != float64(1) || m["result"] == nil {
		t.Fatalf("initialize: %v", m)
	}
	r.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	r.send(t, `{"jsonrpc":"2.0","id":10,"method":"tools/list"`) // cut short
	if m := r.recv(t); errCode(m) != -32700 {
		t.Errorf("truncated line: %v", m)
	}
	r.send(t, `{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"echo hi"}}}`)
	m := r.recv(t)
	res, _ := m["result"].(map[string]any)
	if m["id"] != float64(11) || res == nil || res["isError"] == true {
		t.Errorf("a call after the bad lines: %v", m)
	}
}

// TestLongErrorsAreCut: an error that would echo a huge request is cut.
func TestLongErrorsAreCut(t *testing.T) {
	r := startRaw(t, &scriptedCore{})
	r.send(t, initLine)
	r.recv(t)
	r.send(t, `{"jsonrpc":"2.0","id":2,"method":"`+strings.Repeat("x", 1<<20)+`"}`)
	m := r.recv(t)
	e, _ := m["error"].(map[string]any)
	if msg, _ := e["message"].(string); m["id"] != float64(2) || len(msg) > maxErrorMessage+100 {
		t.Errorf("error of %d bytes for a 1 MiB method name", len(msg))
	}
}

// TestCancelledCallGetsNoResult: once the client cancels a call, the
// server sends nothing for it, and the run is cancelled.
func TestCancelledCallGetsNoResult(t *testing.T) {
	started, ended := make(chan struct{}), make(chan error, 1)
	core := &scriptedCore{run: func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		close(started)
		<-ctx.Done()
		ended <- ctx.Err()
		return nil, ctx.Err()
	}}
	r := startRaw(t, core)
	r.send(t, initLine)
	r.recv(t)
	r.send(t, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	r.send(t, `{"jsonrpc":"2.0","id":"run-1","method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"sleep 600"}}}`)
	<-started
	r.send(t, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":"run-1","reason":"user"}}`)
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the run ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the run was not cancelled")
	}
	r.quiet(t, 300*time.Millisecond)
	r.send(t, `{"jsonrpc":"2.0","id":3,"method":"ping"}`)
	if m := r.recv(t); m["id"] != float64(3) {
		t.Errorf("after the cancelled call the server wrote %v; want only the ping's answer", m)
	}
}

func TestReadLine(t *testing.T) {
	in := "short\n" + strings.Repeat("y", 50) + "\nok\nlast"
	br := bufio.NewReaderSize(strings.NewReader(in), 16)
	var got []string
	for {
		line, err := readLine(br, 10)
		switch {
		case errors.Is(err, errLineTooLong):
			got = append(got, "<too long>")
			continue
		case err != nil && !errors.Is(err, io.EOF):
			t.Fatal(err)
		}
		got = append(got, string(line))
		if err != nil {
			break
		}
	}
	want := []string{"short", "<too long>", "ok", "last"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("lines %q; want %q", got, want)
	}
}

// TestStopEndsRunsInFlight: when the server is told to stop (its context
// ends, as on SIGTERM) it answers the call in flight with a JSON-RPC error
// saying it is shutting down, cancels the run at once instead of waiting
// for it, sends nothing more for the call, and returns.
func TestStopEndsRunsInFlight(t *testing.T) {
	core := newBlockingCore()
	srv, err := New(Config{Core: core, NoStartupGC: true})
	if err != nil {
		t.Fatal(err)
	}
	inR, inW := io.Pipe()
	defer inW.Close()
	outR, outW := io.Pipe()
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(outR)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	ctx, stop := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() {
		ran <- srv.Run(ctx, &StdioTransport{Reader: inR, Writer: outW})
		outW.Close()
	}()
	for _, line := range []string{initLine, `{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"sleep 600"}}}`} {
		io.WriteString(inW, line+"\n")
	}
	core.waitStarted(t)
	t0 := time.Now()
	stop()
	select {
	case err := <-ran:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		if d := time.Since(t0); d > 5*time.Second {
			t.Errorf("Run took %v to return", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10 s of being stopped with a run in flight")
	}
	if err := <-core.ended; !errors.Is(err, context.Canceled) {
		t.Errorf("the run ended with %v; want it cancelled", err)
	}
	var answers []string
	for line := range lines {
		if strings.Contains(line, `"id":2`) {
			answers = append(answers, line)
		}
	}
	if len(answers) != 1 || !strings.Contains(answers[0], `"error"`) || !strings.Contains(answers[0], "shutting down") {
		t.Errorf("the call in flight was answered %q; want one JSON-RPC error saying the server is shutting down", answers)
	}
}
