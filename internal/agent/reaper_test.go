package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentclient"
	"isopod/internal/agentproto"
)

const pid1ModeEnv = "ISOPOD_AGENT_TEST_REAP_ALL"

// TestMain doubles as an exec stub (with ExecStubArg) and as a stand-in
// for PID 1: with pid1ModeEnv set, the test binary becomes a child
// subreaper and serves the protocol on stdin and
// stdout with ReapAll, so the process-wide reaper is exercised without
// stealing the wait statuses of the other tests.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == ExecStubArg {
		RunExecStub() // the test binary as an exec stub (exec_stub_test.go)
	}
	if os.Getenv(pid1ModeEnv) == "1" {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
			os.Exit(3)
		}
		err := Serve(context.Background(), stdio{os.Stdin, os.Stdout}, Options{ReapAll: true, Logger: NewConsoleLogger(os.Stderr, false)})
		if err != nil && !errors.Is(err, io.EOF) {
			fmt.Fprintln(os.Stderr, "serve:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	if os.Getenv(nsModeEnv) == "1" {
		os.Exit(runInNamespaces())
	}
	os.Exit(m.Run())
}

// stdioConn joins an agent process's stdout and stdin into one stream.
// Close closes its stdin only: the agent then exits, which ends stdout.
type stdioConn struct {
	r io.Reader
	w io.WriteCloser
}

func (c stdioConn) Read(p []byte) (int, error)  { return c.r.Read(p) }
func (c stdioConn) Write(p []byte) (int, error) { return c.w.Write(p) }
func (c stdioConn) Close() error                { return c.w.Close() }

// zombieChildren lists children of pid that are zombies.
func zombieChildren(pid int) []string {
	var z []string
	for _, p := range procs() {
		if len(p.fields) > 1 && p.fields[0] == "Z" && p.fields[1] == strconv.Itoa(pid) {
			z = append(z, p.pid)
		}
	}
	return z
}

func TestReapAll(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a subreaper copy of the test binary; skipped in -short")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), pid1ModeEnv+"=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("agent process: %v", err)
			}
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
			t.Error("agent process did not exit after its stdin closed")
		}
	})
	c := agentclient.New(stdioConn{out, in}, nil)
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.WaitHello(ctx); err != nil {
		t.Fatalf("WaitHello: %v", err)
	}

	// Many short processes at once: a status that arrives before its pid is
	// registered must still reach its exec.
	codes := make([]int, 30)
	var wg sync.WaitGroup
	for i := range codes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			codes[i] = -1
			done, err := c.Exec(ctx, agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"sh", "-c", "exit " + strconv.Itoa(i%3)}}})
			if err == nil && done.ExitCode != nil {
				codes[i] = *done.ExitCode
			}
		}()
	}
	wg.Wait()
	for i, code := range codes {
		if code != i%3 {
			t.Errorf("exec %d: code %d; want %d", i, code, i%3)
		}
	}

	// Orphans: a background child killed with the group and one that left
	// the group and exits later are both re-parented to the agent, which
	// must reap them.
	var stderr bytes.Buffer
	done, err := c.Exec(ctx, agentclient.ExecRequest{Exec: agentproto.Exec{Argv: []string{"sh", "-c", "sleep 5 & setsid sleep 0.2 & echo $$"}}, Stderr: &stderr})
	if err != nil || done.ExitCode == nil || *done.ExitCode != 0 {
		t.Fatalf("orphan maker: %+v, %v, stderr %q", done, err, stderr.String())
	}
	var z []string
	for i := 0; i < 40; i++ {
		time.Sleep(50 * time.Millisecond)
		if z = zombieChildren(cmd.Process.Pid); len(z) == 0 && i >= 6 {
			break
		}
	}
	if len(z) > 0 {
		t.Errorf("zombie children of the agent not reaped: %v", z)
	}
}
