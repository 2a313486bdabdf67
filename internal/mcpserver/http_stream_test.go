package mcpserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"isopod/internal/report"
	"isopod/internal/sandbox"
)

// tap is an HTTP client transport that keeps what the server sent, and can
// cut the first cuts responses to a tools/call after their first event
// that carries an id, as a dropped connection would.
type tap struct {
	next http.RoundTripper

	mu        sync.Mutex
	cuts      int
	exchanges []*exchange
	// cutAt says when to cut a response that is to be cut (default: once
	// it holds a whole event with an id).
	cutAt func(body string) bool
}

// exchange is one request and what the server answered.
type exchange struct {
	method, lastEventID string
	call                bool // a tools/call
	status              int
	cut                 bool
	body                lockedBuffer
	done                chan struct{} // closed when the response ended
}

func (tp *tap) RoundTrip(r *http.Request) (*http.Response, error) {
	ex := &exchange{method: r.Method, lastEventID: r.Header.Get("Last-Event-ID"), done: make(chan struct{})}
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(b))
		ex.call = bytes.Contains(b, []byte(`"tools/call"`))
	}
	tp.mu.Lock()
	if ex.call && tp.cuts > 0 {
		tp.cuts--
		ex.cut = true
	}
	tp.exchanges = append(tp.exchanges, ex)
	tp.mu.Unlock()
	resp, err := tp.next.RoundTrip(r)
	if err != nil {
		close(ex.done)
		return nil, err
	}
	ex.status = resp.StatusCode
	cutAt := tp.cutAt
	if cutAt == nil {
		cutAt = hasIDEvent
	}
	resp.Body = &tapBody{ex: ex, r: resp.Body, cutAt: cutAt}
	return resp, nil
}

func (tp *tap) all() []*exchange {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]*exchange(nil), tp.exchanges...)
}

type tapBody struct {
	ex     *exchange
	r      io.ReadCloser
	cutAt  func(string) bool
	once   sync.Once
	dropAt bool
}

func (b *tapBody) Read(p []byte) (int, error) {
	if b.dropAt {
		b.end()
		return 0, errors.New("the test dropped the connection")
	}
	n, err := b.r.Read(p)
	b.ex.body.Write(p[:n])
	b.dropAt = b.ex.cut && b.cutAt(b.ex.body.String())
	if err != nil {
		b.end()
	}
	return n, err
}

// hasIDEvent reports whether stream holds a whole event with an id.
func hasIDEvent(stream string) bool {
	events := strings.Split(stream, "\n\n")
	for _, ev := range events[:len(events)-1] {
		for line := range strings.SplitSeq(ev, "\n") {
			if strings.HasPrefix(line, "id: ") {
				return true
			}
		}
	}
	return false
}

func (b *tapBody) end() {
	b.once.Do(func() {
		b.r.Close()
		close(b.ex.done)
	})
}

func (b *tapBody) Close() error {
	b.end()
	return nil
}

// blockingCore runs until its context ends or the test releases it.
type blockingCore struct {
	scriptedCore
	started  chan struct{}
	release  chan struct{}
	ended    chan error // the run's context error, nil if released
	startOne sync.Once
}

func newBlockingCore() *blockingCore {
	c := &blockingCore{started: make(chan struct{}), release: make(chan struct{}), ended: make(chan error, 1)}
	c.run = func(ctx context.Context, _ sandbox.Request) (*report.Run, error) {
		c.startOne.Do(func() { close(c.started) })
		select {
		case <-c.release:
			c.ended <- nil
			code := 0
			return &report.Run{OK: true, VMID: "vm-test", Outcome: report.Outcome{ExitCode: &code, Stdout: "released\n"}, Path: "cold"}, nil
		case <-ctx.Done():
			c.ended <- ctx.Err()
			return nil, ctx.Err()
		}
	}
	return c
}

func (c *blockingCore) waitStarted(t *testing.T) {
	t.Helper()
	select {
	case <-c.started:
	case <-time.After(20 * time.Second):
		t.Fatal("the run never started")
	}
}

// TestHTTPResumesADroppedStream: a client whose connection drops in the
// middle of a call (here the SDK's Go client, under 2025-11-25) reconnects
// with Last-Event-ID and gets the result: the run went on, its VM was torn
// down once it ended, and its place was given back.
func TestHTTPResumesADroppedStream(t *testing.T) {
	t.Parallel()
	core, drv := newFakeCore(t)
	adm := mustAdmission(t, 2, 2)
	h := startHTTP(t, Config{Core: core, Admission: adm, ProgressInterval: time.Hour}, nil)
	tp := &tap{next: http.DefaultTransport, cuts: 1}
	s, err := connectHTTPAs(t, h.url, runToken, tp, "2025-11-25", 5)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := s.call(t, ctx, ToolSandboxRun, map[string]any{
		"cmd": "sleep 2; echo still here", "base": "base-min", "network": false, "cwd": "/"}, nil)
	if rep := reportOf(t, res); res.IsError || rep.Stdout != "still here\n" {
		t.Errorf("the resumed call gave %s", resultText(res))
	}
	var cut, resumed bool
	for _, ex := range tp.all() {
		cut = cut || ex.cut
		resumed = resumed || ex.method == "GET" && ex.lastEventID != "" && ex.status == http.StatusOK
	}
	if !cut || !resumed {
		t.Errorf("cut %v, resumed with Last-Event-ID %v: the test did not drop and resume a stream", cut, resumed)
	}
	if !waitFor(10*time.Second, func() bool { return liveMachines(drv) == 0 && adm.Stats().Running == 0 }) {
		t.Errorf("after the call: %d machines, admission %+v", liveMachines(drv), adm.Stats())
	}
}

// post sends one JSON-RPC message as a client of version does.
func post(t *testing.T, url, token, version, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", version)
	resp, err := httpClient(token, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// resumeGET asks for the rest of a stream after lastID.
func resumeGET(t *testing.T, url, token, lastID string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	req.Header.Set("Last-Event-ID", lastID)
	resp, err := httpClient(token, nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

// sseEvent is one server-sent event.
type sseEvent struct{ id, data string }

// readEvent reads the next event.
func readEvent(br *bufio.Reader) (sseEvent, error) {
	var ev sseEvent
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if ev.id != "" || ev.data != "" {
				return ev, nil
			}
		case strings.HasPrefix(line, "id: "):
			ev.id = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
}

// TestHTTPStreamOutlivesItsConnection: under 2025-06-18 (no event opens
// the stream), a call whose client goes away after its first progress
// notification runs to its end, without a VM left behind; a GET with the
// last event id it saw gets the rest, the result included, for that
// token only; the spent stream then answers 204, and an unknown one 404.
func TestHTTPStreamOutlivesItsConnection(t *testing.T) {
	t.Parallel()
	core, drv := newFakeCore(t)
	adm := mustAdmission(t, 2, 2)
	h := startHTTP(t, Config{Core: core, Admission: adm, ProgressInterval: time.Hour}, nil)
	call := `{"jsonrpc":"2.0","id":"c-1","method":"tools/call","params":{"name":"sandbox_run","_meta":{"progressToken":"p"},` +
		`"arguments":{"cmd":"sleep 2; echo finished","base":"base-min","network":false,"cwd":"/"}}}`
	resp := post(t, h.url, runToken, "2025-06-18", call)
	first, err := readEvent(bufio.NewReader(resp.Body))
	resp.Body.Close() // the client goes away
	if err != nil || first.id == "" || !strings.Contains(first.data, "notifications/progress") {
		t.Fatalf("first event %+v (%v); want a progress notification with an id", first, err)
	}
	if !waitFor(20*time.Second, func() bool { return liveMachines(drv) == 1 }) {
		t.Fatal("the VM never started")
	}
	if !waitFor(30*time.Second, func() bool { return liveMachines(drv) == 0 && adm.Stats().Running == 0 }) {
		t.Fatalf("the run did not end and clean up: %d machines, admission %+v", liveMachines(drv), adm.Stats())
	}
	if r, body := resumeGET(t, h.url, adminToken, first.id); r.StatusCode != http.StatusNotFound {
		t.Errorf("another token resumed the stream: HTTP %d %.200s", r.StatusCode, body)
	}
	r, body := resumeGET(t, h.url, runToken, first.id)
	last, err := readEvent(bufio.NewReader(strings.NewReader(body)))
	var msg struct {
		ID     string
		Result struct{ StructuredContent RunResult }
	}
	json.Unmarshal([]byte(last.data), &msg)
	if r.StatusCode != http.StatusOK || err != nil || msg.ID != "c-1" || msg.Result.StructuredContent.Stdout != "finished\n" {
		t.Fatalf("resuming after %s: HTTP %d %.500s", first.id, r.StatusCode, body)
	}
	if r, body := resumeGET(t, h.url, runToken, last.id); r.StatusCode != http.StatusNoContent {
		t.Errorf("resuming after the last event: HTTP %d %.200s; want 204", r.StatusCode, body)
	}
	if r, _ := resumeGET(t, h.url, runToken, "nosuchstream_3"); r.StatusCode != http.StatusNotFound {
		t.Errorf("an unknown stream: HTTP %d; want 404", r.StatusCode)
	}
}

// TestHTTPCancelledCallIsNotAnswered: a notifications/cancelled naming a
// call cancels its run, and the call's stream ends without a response.
func TestHTTPCancelledCallIsNotAnswered(t *testing.T) {
	for _, version := range []string{"2025-06-18", "2025-11-25"} {
		t.Run(version, func(t *testing.T) {
			core := newBlockingCore()
			h := startHTTP(t, Config{Core: core, ProgressInterval: time.Hour}, nil)
			streamed := make(chan string, 1)
			go func() {
				resp := post(t, h.url, runToken, version, `{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"sandbox_run","arguments":{"cmd":"sleep 600"}}}`)
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				streamed <- string(b)
			}()
			core.waitStarted(t)
			if r := post(t, h.url, runToken, version, `{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":7}}`); r.StatusCode != http.StatusAccepted {
				t.Errorf("the cancellation: HTTP %d", r.StatusCode)
			}
			select {
			case err := <-core.ended:
				if !errors.Is(err, context.Canceled) {
					t.Errorf("the run ended with %v; want it cancelled", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the run was not cancelled")
			}
			select {
			case body := <-streamed:
				if strings.Contains(body, `"result"`) || strings.Contains(body, `"error"`) {
					t.Errorf("the cancelled call was answered: %.300s", body)
				}
			case <-time.After(10 * time.Second):
				t.Error("the cancelled call's stream never ended")
			}
		})
	}
}

// TestHTTPShutdownAnswersCallsInFlight: a server told to stop (as by
// SIGTERM) answers a call in flight with a JSON-RPC error saying so,
// cancels its run, and stops within a few seconds, under each protocol
// the SDK's client speaks.
func TestHTTPShutdownAnswersCallsInFlight(t *testing.T) {
	for _, version := range []string{"2025-11-25", ""} {
		t.Run("version "+version, func(t *testing.T) {
			core := newBlockingCore()
			h := startHTTP(t, Config{Core: core, ProgressInterval: time.Hour}, nil)
			s, err := connectHTTPAs(t, h.url, runToken, nil, version, 0)
			if err != nil {
				t.Fatal(err)
			}
			answered := make(chan error, 1)
			go func() {
				_, err := s.cs.CallTool(context.Background(), &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{"cmd": "sleep 600"}})
				answered <- err
			}()
			core.waitStarted(t)
			t0 := time.Now()
			h.stop()
			select {
			case err := <-answered:
				if err == nil || !strings.Contains(err.Error(), "shutting down") || !strings.Contains(err.Error(), "cancelled") {
					t.Errorf("the call in flight got %v; want an error saying the server is shutting down", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the call in flight got no answer within 10 s of the stop")
			}
			select {
			case err := <-h.served:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
				if d := time.Since(t0); d > 5*time.Second {
					t.Errorf("the server took %v to stop", d)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the server did not stop")
			}
			if err := <-core.ended; !errors.Is(err, context.Canceled) {
				t.Errorf("the run ended with %v; want it cancelled", err)
			}
		})
	}
}

// TestHTTPDisconnectCancelsUnder2026: under the 2026-07-28 protocol (the
// Go client's default), which has no resumption, the POST is the call: a
// client that goes away cancels its run.
func TestHTTPDisconnectCancelsUnder2026(t *testing.T) {
	core := newBlockingCore()
	h := startHTTP(t, Config{Core: core, ProgressInterval: time.Hour}, nil)
	tp := &tap{next: http.DefaultTransport, cuts: 1, cutAt: func(body string) bool { return strings.Contains(body, "\n\n") }}
	s, err := connectHTTPAs(t, h.url, runToken, tp, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	p := &mcp.CallToolParams{Name: ToolSandboxRun, Arguments: map[string]any{"cmd": "sleep 600"}}
	p.SetProgressToken("p")
	go s.cs.CallTool(context.Background(), p)
	select {
	case err := <-core.ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the run ended with %v; want it cancelled", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the run went on after its client went away")
	}
	for _, ex := range tp.all() {
		if ex.method == "GET" && ex.lastEventID != "" {
			t.Errorf("the client resumed with Last-Event-ID %s under 2026-07-28", ex.lastEventID)
		}
	}
}
