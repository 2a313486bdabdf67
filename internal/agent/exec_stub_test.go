package agent

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"isopod/internal/agentproto"
)

// The exec stub's tests run the test binary as the stub (TestMain).

func stubOptions() Options {
	return Options{ExecStub: os.Args[0]}
}

// readyStub has the server make a stub (as before a snapshot: settle)
// and returns its pid.
func (c *testConn) readyStub() int {
	c.t.Helper()
	if err := c.call(&agentproto.Msg{Kind: agentproto.KindSettle}, nil); err != nil {
		c.t.Fatalf("settle: %v", err)
	}
	c.srv.stub.mu.Lock()
	defer c.srv.stub.mu.Unlock()
	if c.srv.stub.v == nil {
		c.t.Fatal("no exec stub after a settle")
	}
	return c.srv.stub.v.pid
}

// processFacts is what a command can see of how it was started. Its
// blocked signals are checked apart: a forked command gets those the test
// binary started with, a PID-1 agent's none.
const processFacts = `grep -E '^(SigIgn|NoNewPrivs|Seccomp|CapEff|CapBnd)' /proc/$$/status; ` +
	`ulimit -n; ulimit -Hn; umask; pwd; env | sort; ` +
	`[ "$(ps -o pgid= -p $$ | tr -d ' ')" = "$$" ] && echo own-group; ` +
	`[ "$PPID" = "` + "%d" + `" ] && echo child-of-agent; echo "pid $$"`

// TestExecStubStartsAsForkDoes runs the same command through a stub and by
// a fork: it must see the same process (signals, limits, umask, cwd, its
// group, its parent and exactly the environment asked for), and the stub's
// run must be the stub's own process.
func TestExecStubStartsAsForkDoes(t *testing.T) {
	dir := t.TempDir()
	script := fmt.Sprintf(processFacts, os.Getpid())
	e := agentproto.Exec{Argv: []string{"sh", "-c", script}, Cwd: dir, Env: []string{"FOO=bar baz"}}

	fork := startAgent(t, Options{})
	forked := fork.exec(e)

	c := startAgent(t, stubOptions())
	c.exec(agentproto.Exec{Argv: []string{"true"}})
	if c.srv.stub.ready() {
		t.Error("an exec made a stub; only a settle should")
	}
	pid := c.readyStub()
	stubbed := c.exec(e)
	if stubbed.code() != 0 || forked.code() != 0 {
		t.Fatalf("exit codes %d (stub) and %d (fork); stderr %q, %q", stubbed.code(), forked.code(), stubbed.stderr, forked.stderr)
	}
	lines := func(r execResult) []string { return strings.Split(strings.TrimSpace(string(r.stdout)), "\n") }
	got, want := lines(stubbed), lines(forked)
	if got[len(got)-1] != "pid "+strconv.Itoa(pid) {
		t.Errorf("the command ran as %q; want the stub's pid %d", got[len(got)-1], pid)
	}
	if !reflect.DeepEqual(got[:len(got)-1], want[:len(want)-1]) {
		t.Errorf("through the stub the command saw\n%s\nforked it saw\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	for _, l := range got {
		if strings.HasPrefix(l, "GODEBUG=") || strings.Contains(l, ExecStubArg) {
			t.Errorf("the stub's own setting reached the command: %q", l)
		}
	}
	for _, w := range []string{"FOO=bar baz", "own-group", "child-of-agent", dir} {
		if !strings.Contains(string(stubbed.stdout), w+"\n") {
			t.Errorf("stdout lacks %q:\n%s", w, stubbed.stdout)
		}
	}
	c.readyStub()
	if r := c.exec(agentproto.Exec{Argv: []string{"grep", "^SigBlk", "/proc/self/status"}}); !strings.HasSuffix(string(r.stdout), "\t0000000000000000\n") {
		t.Errorf("through the stub the command started with %q blocked; want none", r.stdout)
	}
}

// TestExecStubCannotStart: a program the kernel refuses fails through the
// stub as it does forked: exit 127 and the same message.
func TestExecStubCannotStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad")
	if err := os.WriteFile(bad, []byte("\x7fELF not really\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	want := "isopod: " + bad + ": exec format error\n"
	for _, tt := range []struct {
		name string
		opts Options
	}{{"fork", Options{}}, {"stub", stubOptions()}} {
		t.Run(tt.name, func(t *testing.T) {
			c := startAgent(t, tt.opts)
			if tt.name == "stub" {
				c.readyStub()
			}
			r := c.exec(agentproto.Exec{Argv: []string{bad}})
			if r.code() != 127 || string(r.stderr) != want {
				t.Errorf("code %d stderr %q; want 127 and %q", r.code(), r.stderr, want)
			}
			// The next command runs all the same.
			if r := c.exec(agentproto.Exec{Argv: []string{"echo", "ok"}}); string(r.stdout) != "ok\n" {
				t.Errorf("next command: stdout %q stderr %q", r.stdout, r.stderr)
			}
		})
	}
}

// TestExecStubUnusable: a stub that a command killed or stopped does not
// fail the exec: it forks, and the stub is ended (the next settle makes
// another). A request too large for a stub forks and leaves it ready.
func TestExecStubUnusable(t *testing.T) {
	defer func(d time.Duration) { stubStart = d }(stubStart)
	stubStart = 300 * time.Millisecond
	big := strings.Repeat("x", maxStubRequest)
	for _, tt := range []struct {
		name string
		sig  unix.Signal
		arg  string
	}{
		{"killed", unix.SIGKILL, "ok"},
		{"stopped", unix.SIGSTOP, "ok"},
		{"too large", 0, big},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := startAgent(t, stubOptions())
			pid := c.readyStub()
			if tt.sig != 0 {
				if err := unix.Kill(pid, tt.sig); err != nil {
					t.Fatal(err)
				}
			}
			r := c.exec(agentproto.Exec{Argv: []string{"sh", "-c", `printf '%s' "$1"; echo " $$"`, "sh", tt.arg}})
			f := strings.Fields(string(r.stdout))
			if r.code() != 0 || len(f) != 2 || f[0] != tt.arg {
				t.Fatalf("code %d stdout %.40q stderr %q", r.code(), r.stdout, r.stderr)
			}
			if f[1] == strconv.Itoa(pid) {
				t.Errorf("the stub (pid %d) ran the command", pid)
			}
			next := c.readyStub()
			if tt.sig == 0 {
				if next != pid {
					t.Errorf("the stub (pid %d) was replaced by %d", pid, next)
				}
				return
			}
			if err := unix.Kill(pid, 0); err == nil {
				t.Errorf("the unusable stub (pid %d) is still there", pid)
			}
			if next == pid {
				t.Errorf("no new stub was made")
			}
		})
	}
}

func TestStubRequestRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		prog, cwd string
		argv, env []string
	}{
		{"/bin/true", "/", []string{"true"}, nil},
		{"/bin/sh", "/root", []string{"sh", "-c", "echo a b", ""}, []string{"A=1", "B=x=y", "EMPTY="}},
	} {
		b, ok := encodeStubRequest(tt.prog, tt.cwd, tt.argv, tt.env)
		prog, cwd, argv, env, err := decodeStubRequest(b)
		if !ok || err != nil || prog != tt.prog || cwd != tt.cwd || !reflect.DeepEqual(argv, tt.argv) || len(env) != len(tt.env) {
			t.Errorf("%q: got %q %q %q %q, %v", tt.argv, prog, cwd, argv, env, err)
		}
	}
	for _, argv := range [][]string{{"echo", "a\x00b"}, {strings.Repeat("x", maxStubRequest)}} {
		if _, ok := encodeStubRequest("/bin/echo", "/", argv, nil); ok {
			t.Errorf("encoding %.20q: ok; want refused", argv)
		}
	}
	for _, b := range []string{"", "/bin/true\x00/", "/bin/true\x00/\x00x\x00true\x00", "/bin/true\x00/\x002\x00true\x00"} {
		if _, _, _, _, err := decodeStubRequest([]byte(b)); err == nil {
			t.Errorf("decoding %q: no error", b)
		}
	}
}
