package agentclient

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"isopod/internal/agent"
	"isopod/internal/agentproto"
)

// result is everything one Exec gave.
type result struct {
	stdout, stderr string
	done           *agentproto.ExecDone
	err            error
}

func (r result) code() int {
	if r.done == nil || r.done.ExitCode == nil {
		return -1
	}
	return *r.done.ExitCode
}

func (r result) signal() int {
	if r.done == nil || r.done.Signal == nil {
		return 0
	}
	return *r.done.Signal
}

func run(t *testing.T, c *Client, e agentproto.Exec, stdin io.Reader) result {
	t.Helper()
	if e.Cwd == "" {
		e.Cwd = "/"
	}
	var o, er bytes.Buffer
	done, err := c.Exec(testCtx(t), ExecRequest{Exec: e, Stdin: stdin, Stdout: &o, Stderr: &er})
	return result{stdout: o.String(), stderr: er.String(), done: done, err: err}
}

func TestExec(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	tests := []struct {
		name           string
		exec           agentproto.Exec
		stdout, stderr string
		code, signal   int
		timedOut       bool
	}{
		{name: "stdout", exec: agentproto.Exec{Argv: []string{"echo", "hello", "world"}}, stdout: "hello world\n"},
		{name: "stderr and code", exec: agentproto.Exec{Argv: []string{"sh", "-c", "echo out; echo err >&2; exit 3"}}, stdout: "out\n", stderr: "err\n", code: 3},
		{name: "env and cwd", exec: agentproto.Exec{Argv: []string{"sh", "-c", `echo "$FOO $(pwd)"`}, Env: []string{"FOO=bar"}, Cwd: "/tmp"}, stdout: "bar /tmp\n"},
		{name: "signal", exec: agentproto.Exec{Argv: []string{"sh", "-c", "kill -TERM $$"}}, code: -1, signal: int(syscall.SIGTERM)},
		{name: "timeout", exec: agentproto.Exec{Argv: []string{"sh", "-c", "echo started; sleep 30"}, TimeoutMS: 300},
			stdout: "started\n", code: -1, signal: int(syscall.SIGKILL), timedOut: true},
		{name: "not found", exec: agentproto.Exec{Argv: []string{"no-such-program-isopod"}}, stderr: "isopod: no-such-program-isopod: command not found\n", code: 127},
		{name: "no stdin is /dev/null", exec: agentproto.Exec{Argv: []string{"cat"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			r := run(t, c, tt.exec, nil)
			if r.err != nil {
				t.Fatalf("Exec: %v", r.err)
			}
			if r.stdout != tt.stdout || r.stderr != tt.stderr {
				t.Errorf("stdout %q stderr %q; want %q and %q", r.stdout, r.stderr, tt.stdout, tt.stderr)
			}
			if r.code() != tt.code || r.signal() != tt.signal || r.done.TimedOut != tt.timedOut {
				t.Errorf("done %+v (code %d signal %d); want code %d signal %d timed out %v", r.done, r.code(), r.signal(), tt.code, tt.signal, tt.timedOut)
			}
			if tt.timedOut && time.Since(start) > 5*time.Second {
				t.Errorf("a 300 ms timeout took %v", time.Since(start))
			}
		})
	}
}

func TestExecRefused(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	r := run(t, c, agentproto.Exec{Argv: []string{"true"}, Env: []string{"=x"}}, nil)
	var ge *guestError
	if r.done != nil || !errors.As(r.err, &ge) {
		t.Errorf("exec with a bad env: done %+v err %v; want the guest's refusal", r.done, r.err)
	}
}

// Megabytes of stdin pass through the credit window and arrive whole.
func TestExecLargeStdin(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	data := make([]byte, 4<<20+123)
	rand.Read(data)
	r := run(t, c, agentproto.Exec{Argv: []string{"sha256sum"}}, bytes.NewReader(data))
	sum := sha256.Sum256(data)
	if r.err != nil || r.code() != 0 || !strings.HasPrefix(r.stdout, hex.EncodeToString(sum[:])) {
		t.Errorf("sha256sum said %q (code %d, err %v); want %x", r.stdout, r.code(), r.err, sum)
	}
}

// stingyReader returns its data in tiny reads, then an empty read, then
// fails.
type stingyReader struct {
	data  []byte
	empty bool
	fail  error
}

func (r *stingyReader) Read(p []byte) (int, error) {
	if len(r.data) > 0 {
		n := copy(p[:min(len(p), 3)], r.data)
		r.data = r.data[n:]
		return n, nil
	}
	if !r.empty {
		r.empty = true
		return 0, nil
	}
	return 0, r.fail
}

// A stdin that fails is closed for the process, which sees what came
// before; the exec itself ends normally.
func TestExecStdinFails(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	in := &stingyReader{data: []byte("partial input"), fail: errors.New("disk error")}
	r := run(t, c, agentproto.Exec{Argv: []string{"cat"}}, in)
	if r.err != nil || r.code() != 0 || r.stdout != "partial input" {
		t.Errorf("cat of a failing stdin: %q code %d err %v; want the partial input and 0", r.stdout, r.code(), r.err)
	}
}

// failWriter fails every write.
type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errPipeBroken }

var errPipeBroken = errors.New("pipe broken")

// A failing output writer does not stop the exec; the error comes with
// its result.
func TestExecOutputWriteFails(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	done, err := c.Exec(testCtx(t), ExecRequest{
		Exec:   agentproto.Exec{Argv: []string{"sh", "-c", "echo out; sleep 0.1; echo more"}, Cwd: "/"},
		Stdout: failWriter{},
	})
	if done == nil || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Errorf("done %+v; want the exec to complete", done)
	}
	if !errors.Is(err, errPipeBroken) {
		t.Errorf("err %v; want the stdout write error", err)
	}
}

// Requests in flight at once each get their own output.
func TestConcurrentRequests(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, 2*n)
	start := time.Now()
	for i := range n {
		wg.Add(2)
		go func() {
			defer wg.Done()
			want := strings.Repeat(fmt.Sprintf("exec %d\n", i), 1000)
			r := run(t, c, agentproto.Exec{Argv: []string{"sh", "-c", fmt.Sprintf("sleep 0.3; for i in $(seq 1000); do echo 'exec %d'; done", i)}}, nil)
			if r.err != nil || r.stdout != want {
				errs <- fmt.Errorf("exec %d: %d bytes of stdout, err %v; want its own %d bytes", i, len(r.stdout), r.err, len(want))
			}
		}()
		go func() {
			defer wg.Done()
			if err := c.Call(testCtx(t), &agentproto.Msg{Kind: agentproto.KindPing}, nil); err != nil {
				errs <- fmt.Errorf("ping %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if d := time.Since(start); d > 8*time.Second {
		t.Errorf("%d concurrent execs of 0.3 s took %v; they did not overlap", n, d)
	}
}

// memFile is an in-memory io.WriterAt that records the size of every
// write.
type memFile struct {
	b     []byte
	sizes []int
	fail  error
}

func (f *memFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fail != nil {
		return 0, f.fail
	}
	if end := off + int64(len(p)); end > int64(len(f.b)) {
		f.b = append(f.b, make([]byte, end-int64(len(f.b)))...)
	}
	f.sizes = append(f.sizes, len(p))
	return copy(f.b[off:], p), nil
}

func TestCopyOut(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	ctx := testCtx(t)
	dir := t.TempDir()
	data := make([]byte, 3<<20+7)
	rand.Read(data)
	file := filepath.Join(dir, "data")
	if err := os.WriteFile(file, data, 0o640); err != nil {
		t.Fatal(err)
	}
	os.Chmod(file, 0o640)

	var w memFile
	fd, err := c.CopyOut(ctx, file, CopyLimits{MaxSize: int64(len(data)), MaxData: NoLimit}, &w)
	if err != nil {
		t.Fatalf("CopyOut: %v", err)
	}
	if !bytes.Equal(w.b, data) || fd.Bytes != int64(len(data)) || fd.Data != int64(len(data)) || fd.Mode != 0o640 {
		t.Errorf("got %d bytes, done %+v; want the %d bytes of the file and mode 0640", len(w.b), fd, len(data))
	}
	for _, n := range w.sizes {
		if n == 0 || n > agentproto.ChunkSize {
			t.Fatalf("a chunk of %d bytes; want 1..%d", n, agentproto.ChunkSize)
		}
	}

	bad := []struct {
		name string
		path string
		lim  CopyLimits
		w    io.WriterAt
		want string
	}{
		{"over the size limit", file, CopyLimits{MaxSize: int64(len(data)) - 1, MaxData: NoLimit}, &memFile{}, "over the limit"},
		{"over the data limit", file, CopyLimits{MaxData: 1000}, &memFile{}, "more than 1000 bytes"},
		{"missing", filepath.Join(dir, "nope"), CopyLimits{MaxData: NoLimit}, &memFile{}, "no such file or directory"},
		{"directory", dir, CopyLimits{MaxData: NoLimit}, &memFile{}, "is a directory"},
		{"writer fails", file, CopyLimits{MaxData: NoLimit}, &memFile{fail: errors.New("pipe broken")}, "pipe broken"},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			fd, err := c.CopyOut(ctx, tt.path, tt.lim, tt.w)
			if err == nil || fd != nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), "copy-out "+tt.path) {
				t.Errorf("CopyOut = %+v, %v; want an error naming the path and containing %q", fd, err, tt.want)
			}
		})
	}
	// The connection is still good after the refusals.
	if err := c.Call(ctx, &agentproto.Msg{Kind: agentproto.KindPing}, nil); err != nil {
		t.Errorf("ping after failed copy-outs: %v", err)
	}
}

// TestExecDoesNotWaitForIdleStdin: a command that ends without reading its
// stdin ends the exec even while the stdin reader blocks.
func TestExecDoesNotWaitForIdleStdin(t *testing.T) {
	c, _ := ready(t, agent.Options{})
	pr, pw := io.Pipe()
	defer pw.Close()
	done := make(chan error, 1)
	go func() {
		_, err := c.Exec(testCtx(t), ExecRequest{Exec: agentproto.Exec{Argv: []string{"true"}}, Stdin: pr})
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec did not return while its stdin reader blocked")
	}
}
